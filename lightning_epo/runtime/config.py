"""Checks of the composed config that Hydra cannot do: types, ranges and registered names, all at start.

Hydra already rejects unknown keys (``Key 'x' is not in struct``) and unknown group options. Every number and
switch of the configs has a rule in :data:`RULES` (a key absent from the composed config, e.g. another
environment's, is skipped): the algorithm's come from its typed settings (:class:`lightning_epo.algos.settings.
AlgoConfig`), into which :func:`validate` also merges the composed ``algo``; the checks that relate several keys
follow in :func:`validate`.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path
from typing import get_args

import hydra
import torch
from lightning.fabric.plugins.precision.precision import _PRECISION_INPUT_STR, _PRECISION_INPUT_STR_ALIAS
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from lightning_epo.algos.settings import AlgoConfig
from lightning_epo.core import layout
from lightning_epo.core.errors import ConfigError, UserError
from lightning_epo.core.rules import (
    FRACTION,
    NON_NEGATIVE,
    POSITIVE,
    SWITCH,
    TEMPERATURE,
    TOP_P,
    Rule,
    integer,
    names_of,
    number,
    one_of,
    rules_of,
)
from lightning_epo.envs.sciworld import TASK_NAMES
from lightning_epo.models.loading import check_hub_access, load_tokenizer
from lightning_epo.rollout.collector import fixed_prompt_tokens
from lightning_epo.rollout.datamodule import TASK_ORDERS
from lightning_epo.rollout.vllm_engine import CPU_BLOCK_SIZE, VLLM_MISSING
from lightning_epo.runtime.engine_choice import is_vllm, vllm_installed
from lightning_epo.training.checkpoint_io import finished_steps_in, is_intact, unsafe_content

log = logging.getLogger(__name__)

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


RULES: dict[str, Rule] = {
    # run
    "total_steps": integer(), "test_every": integer(), "seed": integer(0), "stop_at_step": integer(optional=True),
    "torch_threads": integer(optional=True), "export_policy": SWITCH, "val_at_start": SWITCH,
    # data and sampling
    "data.episodes_per_step": integer(), "data.oversample": integer(),
    "data.train_sampling.temperature": TEMPERATURE, "data.train_sampling.top_p": TOP_P,
    "data.val_sampling.temperature": TEMPERATURE, "data.val_sampling.top_p": TOP_P,
    "data.val_engine.batch_size": integer(),
    # environment
    "env.max_turns": integer(), "env.history_length": integer(0), "env.val_size": integer(optional=True),
    "env.invalid_action_penalty": NON_NEGATIVE, "env.pool_size": integer(),
    "env.pool.step_timeout_s": POSITIVE, "env.pool.reset_timeout_s": POSITIVE,
    "env.suite.size": integer(3), "env.suite.ood_size": integer(3), "env.suite.min_distance": integer(),
    "env.suite.max_distance": integer(), "env.suite.ood_min_distance": integer(), "env.suite.ood_max_distance": integer(),
    "env.suite.wall_density": number(0, 1, open_high=True), "env.suite.num_train_tasks": integer(),
    "env.suite.num_eval_tasks": integer(), "env.suite.success_reward": POSITIVE, "env.suite.cache_size": integer(),
    "env.suite.jvm_heap_mb": integer(256), "env.suite.gold_path": SWITCH, "env.suite.score_reward": NON_NEGATIVE,
    "env.suite.failure_keeps_progress": SWITCH,
    "env.scored": SWITCH, "env.prompt.fixed_first": SWITCH, "env.prompt.action_list": one_of("full", "compact", "none"),
    "env.prompt.actions_only": SWITCH, "env.prompt.transcript": SWITCH,
    "env.suite.task_subset": names_of(TASK_NAMES, optional=True),
    # the env's sizes of experiment=quickstart (what its total_steps, test_every, ... read)
    "env.quickstart.total_steps": integer(), "env.quickstart.test_every": integer(),
    "env.quickstart.val_size": integer(optional=True), "env.quickstart.episodes_per_step": integer(),
    "env.quickstart.oversample": integer(),
    # model
    "model.max_prompt_tokens": integer(), "model.logits_chunk_size": integer(optional=True),
    "model.answer.max_new_tokens": integer(), "model.answer.think": SWITCH,
    "model.shared_prefix": SWITCH, "model.fold_turns": SWITCH,
    "model.trust_remote_code": SWITCH, "model.gradient_checkpointing": SWITCH, "model.build_if_missing": SWITCH,
    "model.tiny.vocab_size": integer(), "model.tiny.hidden_size": integer(), "model.tiny.intermediate_size": integer(),
    "model.tiny.num_layers": integer(), "model.tiny.num_heads": integer(), "model.tiny.num_kv_heads": integer(),
    "model.tiny.seed": integer(0), "model.tiny.init_std": POSITIVE,
    "model.lora.r": integer(optional=True), "model.lora.alpha": POSITIVE,
    "model.lora.dropout": number(0, 1, open_high=True), "model.lora.critic": SWITCH,
    "model.lora.top_layers": integer(optional=True),
    "model.critic_layers": integer(optional=True),
    # rollout
    "rollout.max_new_tokens": integer(), "rollout.think": SWITCH, "rollout.expert_actions": SWITCH,
    "rollout.engine.batch_size": integer(), "rollout.engine.explore_prob": FRACTION,
    "rollout.engine.gpu_memory_utilization": number(0, 1, open_low=True),
    "rollout.engine.kv_cache_gib": number(0, open_low=True, optional=True, example=4),
    "rollout.engine.block_size": integer(optional=True),
    "rollout.engine.sleep_level": integer(1, 2), "rollout.engine.enable_sleep_mode": SWITCH,
    "rollout.engine.enable_prefix_caching": SWITCH,
    "rollout.fallback.engine.batch_size": integer(), "rollout.fallback.expert_actions": SWITCH,  # rollout=vllm_or_hf
    # optimisation
    "optim.actor_lr": number(0, example="3e-4; 0 freezes the actor"), "optim.critic_lr": NON_NEGATIVE,
    "optim.warmup_ratio": number(0, 1, open_high=True), "optim.min_lr_ratio": FRACTION,
    "optim.grad_clip": POSITIVE, "optim.max_skipped_streak": integer(optional=True),
    "optim.max_param_norm_growth": number(1, open_low=True, optional=True, example=2.0),
    "optim.optimizer.weight_decay": NON_NEGATIVE,
    # trainer and logger
    "trainer.num_nodes": integer(), "trainer.max_epochs": integer(), "trainer.log_every_n_steps": integer(),
    "trainer.num_sanity_val_steps": integer(0), "trainer.check_val_every_n_epoch": integer(optional=True),
    "trainer.enable_model_summary": SWITCH, "trainer.strategy.stage": integer(2, 3),
    "trainer.strategy.bucket_size": integer(), "trainer.strategy.find_unused_parameters": SWITCH,
    "trainer.strategy.offload_optimizer": SWITCH, "trainer.strategy.offload_parameters": SWITCH,
    "trainer.strategy.pin_memory": SWITCH, "logger.offline": SWITCH, "logger.log_model": SWITCH,
    "logger.settings.quiet": SWITCH,
    # metrics and callbacks
    "metrics.edge_turns": integer(), "metrics.edge_tokens": integer(),
    "callbacks.checkpoint.every_n_rl_steps": integer(), "callbacks.rollout_samples.num_episodes": integer(0),
} | rules_of(AlgoConfig, "algo")


_ABSENT = object()


def _lookup(cfg: DictConfig, dotted: str) -> object:
    """The value at ``dotted`` (interpolations resolved), or ``_ABSENT`` when a part of the path is missing."""
    node: object = cfg
    for part in dotted.split("."):
        if not isinstance(node, DictConfig) or part not in node:
            return _ABSENT
        node = node[part]
    return node


def check_rules(cfg: DictConfig) -> None:
    """Every key of :data:`RULES` present in ``cfg`` holds what its rule allows."""
    for key, rule in RULES.items():
        value = _lookup(cfg, key)
        if value is not _ABSENT and not rule.accepts(value):
            raise ConfigError(rule.error(key, value))


def _choice(value: object, valid: list[str], key: str) -> None:
    if not (rule := one_of(*valid)).accepts(value):
        raise ConfigError(rule.error(key, value))


def _typed_algo(algo: DictConfig) -> DictConfig:
    """The composed ``algo`` merged into its typed settings (:class:`AlgoConfig`): a key that no algorithm has, or
    one that a config of its own leaves out, is refused in one line."""
    try:
        typed = OmegaConf.merge(OmegaConf.structured(AlgoConfig), OmegaConf.to_container(algo, resolve=True))
    except ConfigKeyError as error:
        raise ConfigError(f"algo.{error.full_key} is not a setting of any algorithm (lightning_epo/algos/settings.py): "
                          "check its spelling, or drop it") from None
    except ValidationError as error:
        raise ConfigError(f"algo.{error.full_key} does not have the type lightning_epo/algos/settings.py gives it "
                          f"({error.msg.splitlines()[0]}): give it a value of that type") from None
    if missing := sorted(OmegaConf.missing_keys(typed)):
        raise ConfigError(f"algo.{missing[0]} is not set: give it a value (conf/algo/ppo.yaml sets every key)")
    return typed


PRECISIONS = [*get_args(_PRECISION_INPUT_STR), *get_args(_PRECISION_INPUT_STR_ALIAS)]  # Lightning's names


def _micro_batch_cut(algo: DictConfig) -> None:
    """Exactly one of ``algo.micro_batch_tokens`` (a token budget) and ``algo.micro_batch_size`` (rows) cuts the
    micro-batches: with both set, one would be ignored."""
    tokens, rows = algo.get("micro_batch_tokens"), algo.get("micro_batch_size")
    if tokens is not None and rows is not None:
        raise ConfigError(
            f"algo.micro_batch_size={rows} and algo.micro_batch_tokens={tokens} both set: micro-batches are cut by "
            "one of them; add algo.micro_batch_tokens=null to cut by rows, or drop algo.micro_batch_size"
        )
    if tokens is None and rows is None:
        raise ConfigError("algo.micro_batch_tokens and algo.micro_batch_size are both null: set one "
                          "(e.g. algo.micro_batch_tokens=4096)")


def _batch_by_episode(cfg: DictConfig) -> None:
    """``algo.batch_by_episode`` counts an episode's shared prefix once in a micro-batch's token budget: only right
    where the decoders compute it once (``model.shared_prefix``), which ZeRO-3 cannot promise (a prefix is used only
    where every rank's micro-batch has one, training/micro_batches.py: ``micro_batch_sharing``)."""
    if not cfg.algo.get("batch_by_episode"):
        return
    if not cfg.model.get("shared_prefix"):
        raise ConfigError("algo.batch_by_episode=true computes an episode's fixed prompt text once only with "
                          "model.shared_prefix=true: set it, or drop algo.batch_by_episode")
    strategy = cfg.trainer.get("strategy")
    if isinstance(strategy, DictConfig) and strategy.get("_target_") == DEEPSPEED_FACTORY and strategy.stage == 3:
        raise ConfigError("algo.batch_by_episode=true under ZeRO-3 would let a micro-batch exceed "
                          "algo.micro_batch_tokens (a rank without a shared prefix turns it off on every rank): "
                          "drop algo.batch_by_episode, or pick trainer=deepspeed_stage_2 / ddp")


def validate(cfg: DictConfig) -> None:
    """Raise :class:`ConfigError` with one line naming the key and the fix."""
    _choice(cfg.mode, ["train", "eval"], "mode")
    _choice(cfg.data.task_order, list(TASK_ORDERS), "data.task_order")
    if cfg.algo.get("kl_estimator") == "k1":
        raise ConfigError(
            "algo.kl_estimator=k1 (log pi - log pi_ref) in the loss has zero expected gradient on-policy: use k2 "
            "(its gradient is the KL's) or k3 (verl's low_var_kl)"
        )
    check_rules(cfg)
    _typed_algo(cfg.algo)
    precision = cfg.trainer.precision  # YAML reads 32 as an integer, which Lightning takes too
    _choice(str(precision) if type(precision) is int else precision, PRECISIONS, "trainer.precision")
    _eval_splits(list(cfg.env.eval_splits))
    if cfg.stop_at_step is not None and cfg.stop_at_step > cfg.total_steps:
        raise ConfigError(f"stop_at_step={cfg.stop_at_step} is beyond total_steps={cfg.total_steps}")
    if cfg.mode == "train" and cfg.test_every > cfg.total_steps:
        log.warning("test_every=%d is above total_steps=%d: no evaluation will run during training (lower test_every "
                    "to evaluate)", cfg.test_every, cfg.total_steps)
    if cfg.data.oversample > 1 and cfg.algo.group_size < 2:
        raise ConfigError(
            f"data.oversample={cfg.data.oversample} needs algo.group_size >= 2 (one rollout per task never mixes wins "
            "and losses): raise algo.group_size or set data.oversample=1"
        )
    if cfg.data.episodes_per_step % cfg.algo.group_size:
        raise ConfigError(
            f"data.episodes_per_step={cfg.data.episodes_per_step} is not a multiple of algo.group_size="
            f"{cfg.algo.group_size}: make it one (e.g. data.episodes_per_step={cfg.algo.group_size * 4})"
        )
    algo = cfg.algo
    if algo.advantage == "grpo" and algo.group_size < 2 and algo.policy_loss != "nll":  # nll: supervised, no advantage
        raise ConfigError(
            f"algo.group_size={algo.group_size} with algo.advantage=grpo: a rollout is scored against the mean of its "
            "group, so every advantage is 0 and only the entropy term trains: set algo.group_size>=2"
        )
    _micro_batch_cut(algo)
    _batch_by_episode(cfg)
    if algo.advantage == "gae" and not algo.critic:
        raise ConfigError("algo.advantage=gae needs algo.critic=true (or use algo.advantage=grpo)")
    if algo.critic and algo.advantage != "gae":
        raise ConfigError(f"algo.critic=true is unused with algo.advantage={algo.advantage}: set algo.critic=false")
    lora = cfg.model.get("lora")
    if lora is not None and lora.critic and (lora.r is None or not algo.critic):
        raise ConfigError(
            "model.lora.critic=true does nothing without model.lora.r and a critic (algo.critic=true): set both or "
            "drop it"
        )
    if lora is not None and lora.get("top_layers") is not None and lora.r is None:
        raise ConfigError(f"model.lora.top_layers={lora.top_layers} does nothing without model.lora.r: set "
                          "model.lora.r=8 (or another rank) or drop it")
    _epo_settings(algo.epo)
    _devices(cfg.trainer.get("devices", "auto"))
    _one_engine_per_rank(cfg)
    if algo.epo.smoothing and algo.entropy_coef == 0:
        raise ConfigError("algo.epo.smoothing=true has no effect with algo.entropy_coef=0 (λ weighs L_H and L_smooth "
                          "alike): set algo.entropy_coef (e.g. 0.001) or drop smoothing")
    if (cfg.get("callbacks") or {}).get("weight_sync") is None:
        raise ConfigError("callbacks.weight_sync is how the generation engines get the actor's weights: keep it")
    if algo.epo.smoothing:
        _smoothing_callbacks(cfg.get("callbacks") or {})
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


VLLM_PARALLEL_SIZES = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")


def _one_engine_per_rank(cfg: DictConfig) -> None:
    """A vLLM engine is one trainer rank's, fed that rank's prompts with that rank's seed: a tensor, pipeline or data
    parallel group of vLLM's, whose members need the same prompts and seed, would hang or sample wrongly."""
    for key, engine in (("rollout.engine", cfg.rollout.engine), ("data.val_engine", cfg.data.get("val_engine"))):
        if not is_vllm(engine):
            continue
        for size in VLLM_PARALLEL_SIZES:
            value = (engine.get("llm_kwargs") or {}).get(size, 1)
            if value != 1:
                raise ConfigError(
                    f"{key}.llm_kwargs.{size}={value}: each trainer rank runs a vLLM engine of its own, on its own "
                    "device with its own prompts and seed, which a vLLM parallel group cannot share: remove it (1); "
                    "for more devices raise trainer.devices"
                )


def _eval_splits(splits: list[str]) -> None:
    """Each evaluation split once (a split named twice would log its metrics twice in one step)."""
    twice = sorted({split for split in splits if splits.count(split) > 1})
    if twice:
        once = ",".join(dict.fromkeys(splits))
        raise ConfigError(f"env.eval_splits lists {', '.join(twice)} twice: list each split once, e.g. "
                          f"env.eval_splits=[{once}]")


def _devices(devices: object) -> None:
    """``trainer.devices``: ``auto`` or a count of devices per node."""
    if devices != "auto" and not integer().accepts(devices):
        raise ConfigError(f"trainer.devices must be 'auto' or {integer().describe()}, got {devices!r}")


def _epo_settings(epo: DictConfig) -> None:
    """β (a number or ``schedule``), the entropy window (``cumulative`` or a size) and κ_l < κ_r (Eq. 5)."""
    if epo.beta != "schedule" and not NON_NEGATIVE.accepts(epo.beta):
        raise ConfigError(f"algo.epo.beta must be 'schedule' (Eq. 7) or {NON_NEGATIVE.describe()}, got {epo.beta!r}")
    if epo.window != "cumulative" and not integer().accepts(epo.window):
        raise ConfigError(f"algo.epo.window must be 'cumulative' or {integer().describe()}, got {epo.window!r}")
    if epo.kappa_l >= epo.kappa_r:
        raise ConfigError(f"algo.epo.kappa_l={epo.kappa_l} must be below algo.epo.kappa_r={epo.kappa_r} (Eq. 5's range)")


SMOOTHING_CALLBACKS = {"entropy_window": "H̄, Eq. 5's reference", "beta_schedule": "β_k, Eq. 7"}


def _smoothing_callbacks(callbacks: DictConfig) -> None:
    """Eq. 6's smoothing reads H̄ and β_k, which two callbacks set before every RL step (conf/callbacks/default.yaml)."""
    for name, sets in SMOOTHING_CALLBACKS.items():
        if callbacks.get(name) is None:
            raise ConfigError(f"algo.epo.smoothing=true needs the callback {name} (it sets {sets}): keep "
                              f"callbacks.{name}, or choose an algorithm without smoothing (e.g. algo=ppo_epo_base)")


def _warm_start(warm_start: DictConfig) -> None:
    experiments = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
    _choice(warm_start.get("experiment"), experiments, "warm_start.experiment")
    for key in ("overrides", "inherit"):
        value = warm_start.get(key)
        if not isinstance(value, ListConfig) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"warm_start.{key} must be a list of strings, got {value!r}")


def resolve_ckpt_path(ckpt_path: str | None, run_dir: Path) -> str | None:
    """``last`` -> ``RUN_DIR/checkpoints/last.ckpt`` (Lightning's convention), or, when that file is missing or
    damaged, the newest intact ``rl_step=K.ckpt`` beside it (with a warning); other paths pass through once checked
    intact. Either is refused in one line when a safe load would refuse it or it is not a Lightning checkpoint."""
    if ckpt_path is None:
        return None
    if ckpt_path != "last":
        if not is_intact(Path(ckpt_path)):
            raise ConfigError(
                f"ckpt_path '{ckpt_path}' is not an intact checkpoint (truncated, or not a Lightning .ckpt): give "
                "another one, e.g. RUN_DIR/checkpoints/rl_step=K.ckpt, or ckpt_path=last"
            )
        if (problem := unsafe_content(Path(ckpt_path))) is not None:
            raise ConfigError(f"ckpt_path '{ckpt_path}' {problem}")
        return ckpt_path
    checkpoints = run_dir / layout.CHECKPOINTS
    last = checkpoints / layout.LAST_CHECKPOINT
    chosen = last if is_intact(last) else _newest_periodic(checkpoints, last)
    if (problem := unsafe_content(chosen)) is not None:
        raise ConfigError(f"{chosen} {problem}")
    return str(chosen)


def _newest_periodic(checkpoints: Path, last: Path) -> Path:
    """The newest intact ``rl_step=K.ckpt`` in place of a missing or damaged ``last.ckpt`` (with a warning)."""
    periodic = sorted(checkpoints.glob("rl_step=*.ckpt"), key=lambda p: int(p.stem.partition("=")[2]), reverse=True)
    fallback = next((p for p in periodic if is_intact(p)), None)
    state = "damaged (truncated)" if last.exists() else "missing"
    if fallback is None and not last.exists():
        raise ConfigError(f"ckpt_path=last but {last} does not exist: pass hydra.run.dir=<the run's directory>")
    if fallback is None:
        raise ConfigError(f"{last} is damaged (truncated) and no intact rl_step=K.ckpt is beside it: start afresh")
    log.warning("%s is %s; resuming from %s, the newest intact checkpoint", last, state, fallback.name)
    return fallback


def check_resume(ckpt_path: str | None, cfg: DictConfig) -> None:
    """A finished run (its checkpoint written after its last RL step) resumed for training: refused in one line when
    ``total_steps`` gives it no step to train, else extended, with a warning on what the schedules do."""
    done = finished_steps_in(Path(ckpt_path)) if ckpt_path is not None and cfg.mode == "train" else None
    if done is None:
        return
    if done >= cfg.total_steps:
        raise ConfigError(
            f"the run of {ckpt_path} finished its {done} RL steps: nothing to train at total_steps={cfg.total_steps}; "
            f"give total_steps above {done} to extend it, or mode=eval to evaluate it"
        )
    log.warning(
        "extending the finished %d-step run to total_steps=%d: the lr schedule and Eq. 7's beta_k follow K=%d from "
        "RL step %d on (its first %d steps followed K=%d), so it is not the run an uninterrupted total_steps=%d gives",
        done, cfg.total_steps, cfg.total_steps, done, done, done, cfg.total_steps,
    )


DEEPSPEED_FACTORY = "lightning_epo.training.strategies.deepspeed_strategy"
CPU_ADAM = "deepspeed.ops.adam.DeepSpeedCPUAdam"


def _missing_for_deepspeed(accelerator: str | None) -> list[str]:
    """What ``trainer=deepspeed_*`` lacks on this machine (CUDA GPUs unless on CPU, the package)."""
    missing = [] if accelerator == "cpu" or torch.cuda.is_available() else ["CUDA GPUs"]
    if importlib.util.find_spec("deepspeed") is None:
        missing.append("the deepspeed package")
    return missing


def _on_cpu(trainer: DictConfig) -> bool:
    """Whether the trainer runs on CPU (``trainer.accelerator=cpu``, or ``auto`` without a CUDA GPU)."""
    accelerator = trainer.get("accelerator", "auto")
    return accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())


def _check_vllm_block_size(engine: DictConfig) -> None:
    """vLLM's CPU attention takes KV blocks of a multiple of ``CPU_BLOCK_SIZE`` tokens (vLLM says so only as its
    engine starts, in a real-model recipe after the warm start); a GPU's takes others."""
    block_size = engine.get("block_size")
    if block_size and block_size % CPU_BLOCK_SIZE and not torch.cuda.is_available():
        raise ConfigError(f"rollout.engine.block_size={block_size}: vLLM on CPU takes multiples of {CPU_BLOCK_SIZE} "
                          f"tokens only; set rollout.engine.block_size={CPU_BLOCK_SIZE} (or null, the same on CPU)")


def _check_model_on_machine(cfg: DictConfig) -> None:
    """The model's dtype can train here (float16: on a GPU) and its attention implementation can run here (flash
    attention: CUDA and its package)."""
    model, trainer = cfg.model, cfg.trainer
    if model.get("dtype") == "float16" and cfg.mode == "train" and _on_cpu(trainer):
        raise UserError(
            "model.dtype=float16 cannot train on CPU (pure float16 training, without a GPU's mixed precision and loss "
            "scaling, diverges; a lower lr does not help): use model.dtype=float32 or bfloat16"
        )
    if model.get("attn_implementation") == "flash_attention_2":
        missing = (["a CUDA GPU"] if _on_cpu(trainer) else []) + (
            ["the flash_attn package"] if importlib.util.find_spec("flash_attn") is None else [])
        if missing:
            raise UserError(
                f"model.attn_implementation=flash_attention_2 needs {' and '.join(missing)}: install it on a CUDA "
                "machine (`pip install flash-attn --no-build-isolation`), or set model.attn_implementation=sdpa"
            )


WANDB_OFF_MODES = ("offline", "dryrun", "disabled")


def _check_wandb_login(logger: DictConfig | None) -> None:
    """``logger=wandb`` online needs credentials (an API key in the environment, or ``wandb login``'s netrc entry):
    without them wandb fails at the first logged value, after the model is built."""
    if not logger or logger.get("offline", True) or os.environ.get("WANDB_MODE") in WANDB_OFF_MODES:
        return
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return
    from wandb.sdk.lib.wbauth.wbnetrc import read_netrc_auth  # wandb's own reading of `wandb login`'s entry

    if read_netrc_auth(host=os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")) is None:
        raise UserError(
            "logger=wandb with logger.offline=false needs a W&B login: run `wandb login` (or set WANDB_API_KEY), or "
            "keep logger.offline=true and `wandb sync` the run directory later"
        )


def cpu_computes_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX-512 BF16 or AMX); otherwise torch emulates it, far slower than
    float32 (0.3-0.7 against 113-119 GFLOP/s on an AVX2 CPU: benchmarks/RESULTS.md section 6)."""
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in
               ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))


def check_machine(cfg: DictConfig) -> None:
    """Fail at start, with one line naming the fix, when this machine cannot run the chosen trainer, engine, model
    or logger (the model's hub id included: not cached and not reachable)."""
    if is_vllm(cfg.rollout.engine):
        if not vllm_installed():
            raise UserError(VLLM_MISSING)
        _check_vllm_block_size(cfg.rollout.engine)
    _check_model_on_machine(cfg)
    _check_wandb_login(cfg.get("logger"))
    check_hub_access(cfg.model)
    trainer = cfg.trainer
    strategy = trainer.get("strategy")
    if isinstance(strategy, DictConfig) and strategy.get("_target_") == DEEPSPEED_FACTORY:
        missing = _missing_for_deepspeed(trainer.get("accelerator"))
        if missing:
            raise UserError(
                f"trainer=deepspeed_stage_{strategy.stage} needs {' and '.join(missing)}: install DeepSpeed with "
                "`pip install -r requirements.txt`, and without GPUs add trainer.accelerator=cpu trainer.devices=2 "
                "trainer.precision=32-true (CPU processes with gloo), or pick trainer=cpu / ddp"
            )
        if strategy.get("offload_optimizer") and cfg.optim.optimizer._target_ != CPU_ADAM:
            raise ConfigError(
                f"trainer.strategy.offload_optimizer=true runs the optimizer on the CPU: set "
                f"optim.optimizer._target_={CPU_ADAM}"
            )
        if cfg.algo.get("target_kl") is not None:
            raise ConfigError(
                "algo.target_kl skips an optimizer step after its backward pass, which DeepSpeed's engine does not "
                "allow for (untested): set algo.target_kl=null, or use trainer=gpu / ddp"
            )
    elif trainer.get("accelerator") in ("gpu", "cuda") and not torch.cuda.is_available():
        raise UserError(
            "trainer.accelerator=gpu but no CUDA GPU is visible: use trainer=cpu, or trainer=ddp "
            "trainer.accelerator=cpu trainer.devices=2 trainer.precision=32-true for data parallelism on CPU"
        )
    bf16_on_cpu = "bf16" in str(trainer.get("precision")) and _on_cpu(trainer)
    if bf16_on_cpu and not cpu_computes_bf16():
        log.warning("trainer.precision=%s on a CPU without AVX-512 BF16 or AMX: bf16 matrix products are emulated, "
                    "far slower than float32 here; trainer.precision=32-true is faster", trainer.precision)


def check_prompt_room(cfg: DictConfig) -> None:
    """``model.max_prompt_tokens`` holds the prompt's fixed text (the environment's instructions, without task,
    observation, history and action list: no prompt is shorter), tokenized by the model's tokenizer."""
    fixed = fixed_prompt_tokens(hydra.utils.instantiate(cfg.data.collector.prompt), load_tokenizer(cfg.model))
    limit = cfg.model.max_prompt_tokens
    if limit < fixed:
        raise ConfigError(
            f"model.max_prompt_tokens={limit} cannot hold the prompt's fixed text ({fixed} tokens for env={cfg.env.name})"
            f": raise model.max_prompt_tokens well above {fixed}, to leave room for the task and the observation "
            "(the model configs ship 2048 or more)"
        )
