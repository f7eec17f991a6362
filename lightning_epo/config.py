"""Checks of the composed config that Hydra cannot do: types, ranges and registered names.

Hydra already rejects unknown keys (``Key 'x' is not in struct``) and unknown group options.
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig, ListConfig

from lightning_epo.algos import ADVANTAGES, KL_ESTIMATORS, PENALTIES, POLICY_LOSSES
from lightning_epo.checkpoint_io import is_intact
from lightning_epo.errors import ConfigError

log = logging.getLogger(__name__)

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def _int(cfg: DictConfig, key: str, minimum: int = 1, optional: bool = False) -> None:
    value = _lookup(cfg, key)
    if value is None and optional:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{key} must be an integer >= {minimum}{' or null' if optional else ''}, got {value!r}")


def _number_above(cfg: DictConfig, key: str, bound: float, example: float) -> None:
    """``key`` must be null or a number > ``bound``."""
    value = _lookup(cfg, key)
    if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool) or value <= bound):
        raise ConfigError(f"{key} must be a number > {bound} (e.g. {example}) or null, got {value!r}")


def _lookup(cfg: DictConfig, dotted: str):
    node = cfg
    for part in dotted.split("."):
        node = node.get(part)
    return node


def _choice(value: object, valid: list[str], key: str) -> None:
    if value not in valid:
        raise ConfigError(f"{key}={value!r} is not valid; choose one of: {', '.join(valid)}")


def validate(cfg: DictConfig) -> None:
    """Raise :class:`ConfigError` with one line naming the key and the fix."""
    _choice(cfg.mode, ["train", "eval"], "mode")
    _int(cfg, "total_steps")
    _int(cfg, "test_every")
    _int(cfg, "seed", minimum=0)
    _int(cfg, "stop_at_step", optional=True)
    _int(cfg, "optim.max_skipped_streak", optional=True)
    if cfg.stop_at_step is not None and cfg.stop_at_step > cfg.total_steps:
        raise ConfigError(f"stop_at_step={cfg.stop_at_step} is beyond total_steps={cfg.total_steps}")
    for key in ("env.max_turns", "env.history_length", "data.episodes_per_step", "data.oversample", "algo.group_size",
                "algo.ppo_epochs", "algo.mini_batches", "algo.micro_batch_size"):
        _int(cfg, key, minimum=0 if key == "env.history_length" else 1)
    if cfg.data.oversample > 1 and cfg.algo.group_size < 2:
        raise ConfigError(
            f"data.oversample={cfg.data.oversample} needs algo.group_size >= 2 (one rollout per task never mixes wins "
            "and losses): raise algo.group_size or set data.oversample=1"
        )
    algo = cfg.algo
    _choice(algo.advantage, ADVANTAGES.names(), "algo.advantage")
    _choice(algo.policy_loss, POLICY_LOSSES.names(), "algo.policy_loss")
    if algo.kl_estimator == "k1":
        raise ConfigError(
            "algo.kl_estimator=k1 (log pi - log pi_ref) in the loss has zero expected gradient on-policy: use k2 "
            "(its gradient is the KL's) or k3 (verl's low_var_kl)"
        )
    _choice(algo.kl_estimator, KL_ESTIMATORS.names(), "algo.kl_estimator")
    _choice(algo.epo.penalty, PENALTIES.names(), "algo.epo.penalty")
    _choice(algo.loss_agg, ["trajectory", "token", "seq_sum_norm"], "algo.loss_agg")
    if algo.loss_agg == "seq_sum_norm":
        _int(cfg, "algo.loss_scale_factor")
    _choice(algo.entropy_decay, ["none", "linear", "cosine"], "algo.entropy_decay")
    if algo.advantage == "gae" and not algo.critic:
        raise ConfigError("algo.advantage=gae needs algo.critic=true (or use algo.advantage=grpo)")
    if algo.advantage == "gae":
        _choice(algo.gae.get("unit", "turn"), ["turn", "token"], "algo.gae.unit")
    if algo.critic and algo.advantage != "gae":
        raise ConfigError(f"algo.critic=true is unused with algo.advantage={algo.advantage}: set algo.critic=false")
    _number_above(cfg, "algo.target_kl", 0, example=0.02)
    _number_above(cfg, "algo.dual_clip", 1, example=3.0)  # dual-clip PPO bounds -c A with c > 1
    if algo.epo.smoothing and not algo.epo.enabled:
        raise ConfigError("algo.epo.smoothing=true has no effect while algo.epo.enabled=false: enable EPO or drop smoothing")
    if algo.mini_batches > 1 and cfg.data.episodes_per_step < algo.mini_batches:
        raise ConfigError("algo.mini_batches is larger than data.episodes_per_step: lower algo.mini_batches")
    if cfg.warm_start:
        _warm_start(cfg.warm_start)
        if cfg.mode == "eval" and cfg.ckpt_path is None:
            raise ConfigError(
                "mode=eval of a warm-started experiment needs the weights to evaluate: give ckpt_path=<run>/checkpoints/"
                "last.ckpt (or warm_start=null model.name_or_path=<run>/warm_start/policy)"
            )
    if cfg.ckpt_path not in (None, "last") and not Path(cfg.ckpt_path).exists():  # DeepSpeed saves directories
        raise ConfigError(f"ckpt_path '{cfg.ckpt_path}' does not exist: give a .ckpt file, or ckpt_path=last")


def _warm_start(warm_start: DictConfig) -> None:
    experiments = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
    _choice(warm_start.get("experiment"), experiments, "warm_start.experiment")
    for key in ("overrides", "inherit"):
        value = warm_start.get(key)
        if not isinstance(value, ListConfig) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"warm_start.{key} must be a list of strings, got {value!r}")


def resolve_ckpt_path(ckpt_path: str | None, run_dir: Path) -> str | None:
    """``last`` -> ``RUN_DIR/checkpoints/last.ckpt`` (Lightning's convention), or, when that file is damaged, the
    newest intact ``rl_step=K.ckpt`` beside it (with a warning); other paths pass through once checked intact."""
    if ckpt_path is None:
        return None
    if ckpt_path != "last":
        if not is_intact(Path(ckpt_path)):
            raise ConfigError(
                f"ckpt_path '{ckpt_path}' is not an intact checkpoint (truncated, or not a Lightning .ckpt): give "
                "another one, e.g. RUN_DIR/checkpoints/rl_step=K.ckpt, or ckpt_path=last"
            )
        return ckpt_path
    checkpoints = run_dir / "checkpoints"
    last = checkpoints / "last.ckpt"
    if not last.exists():
        raise ConfigError(f"ckpt_path=last but {last} does not exist: pass hydra.run.dir=<the run's directory>")
    if is_intact(last):
        return str(last)
    periodic = sorted(checkpoints.glob("rl_step=*.ckpt"), key=lambda p: int(p.stem.partition("=")[2]), reverse=True)
    fallback = next((p for p in periodic if is_intact(p)), None)
    if fallback is None:
        raise ConfigError(f"{last} is damaged (truncated) and no intact rl_step=K.ckpt is beside it: start afresh")
    log.warning("%s is damaged (truncated); resuming from %s, the newest intact checkpoint", last, fallback.name)
    return str(fallback)
