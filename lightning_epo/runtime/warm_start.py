"""``warm_start``: a supervised stage that runs before RL in the same command; RL starts from its policy.

    warm_start:
      experiment: gridworld_sft          # the stage is this experiment ...
      overrides: [total_steps=200]       # ... with these overrides ...
      inherit: [seed, env, model, torch_threads, logger]   # ... and the command line's overrides of these keys

The stage also takes the run's prompt settings (``PROMPT_SETTINGS``), whether the experiment or the command line
set them: it trains on the prompts RL will play. ``python train.py experiment=gridworld_learn env.suite.size=7
seed=3`` runs the stage as ``python train.py experiment=gridworld_sft env.suite.size=7 seed=3
env.history_length=2 rollout.think=false model.max_prompt_tokens=2048 total_steps=200`` in ``RUN_DIR/warm_start``
(own checkpoints, logs and wandb run), which exports its final actor to ``RUN_DIR/warm_start/policy``; the RL
run then loads its actor, its critic's backbone and its reference model from there. Running the command again
on the same run directory (``hydra.run.dir=RUN_DIR``, e.g. to resume) reuses the exported policy, and an
interrupted stage resumes from its own ``last.ckpt``. Where the run generates with vLLM, a stage that evaluates on
an engine of its own evaluates on the run's instead, which RL then takes over (runtime/shared_engine.py).

One process only: with several ranks run the two stages as two commands (``export_policy=true``, then
``model.name_or_path=RUN_DIR/policy``).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from lightning_epo.core import layout
from lightning_epo.core.errors import ConfigError, UserError
from lightning_epo.core.secrets import scrub_secrets
from lightning_epo.runtime.config import CONF_DIR
from lightning_epo.runtime.engine_choice import is_vllm
from lightning_epo.runtime.resolvers import register_resolvers

log = logging.getLogger(__name__)
STAGE_DIR = layout.WARM_START
PROMPT_SETTINGS = ("env.history_length", "rollout.think", "model.max_prompt_tokens")  # what data.collector's prompts read


def override_key(override: str) -> str:
    """The top-level config key a command-line override sets: ``env.max_turns=5`` -> ``env``, ``+a/b=c`` -> ``a``."""
    key = override.split("=", 1)[0].lstrip("+~")
    return re.split(r"[./@]", key, maxsplit=1)[0]


def command_line_overrides() -> list[str]:
    """The overrides of the running ``train.py`` command (none outside a Hydra app)."""
    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def prompt_overrides(cfg: DictConfig) -> list[str]:
    """The run's prompt settings as overrides: ``["env.history_length=0", "rollout.think=false", ...]``."""
    return [f"{key}={json.dumps(OmegaConf.select(cfg, key))}" for key in PROMPT_SETTINGS]


def stage_overrides(cfg: DictConfig, user_overrides: Sequence[str], stage_dir: Path) -> list[str]:
    """The overrides that compose the stage's config for the run ``cfg``, in order (later ones win)."""
    warm_start = cfg.warm_start
    inherited = [o for o in user_overrides if override_key(o) in set(warm_start.inherit)]
    resume = ["ckpt_path=last"] if (stage_dir / layout.CHECKPOINTS / layout.LAST_CHECKPOINT).is_file() else []
    return [
        f"experiment={warm_start.experiment}",
        *inherited,
        *prompt_overrides(cfg),
        *warm_start.overrides,
        f"run_dir={stage_dir}",
        "export_policy=true",
        *resume,
    ]


def evaluated_on_run_engine(stage: DictConfig, cfg: DictConfig) -> DictConfig:
    """``stage`` evaluating its policy on the run's engine (``cfg.rollout.engine``) where the run generates with
    vLLM and the stage evaluates on an engine of its own (``data.val_engine``: its expert plays the training
    episodes): one vLLM engine serves both stages (runtime/shared_engine.py). The engine's interpolations
    (``${model}``, ``${seed}``) resolve in the stage, which inherits both."""
    if is_vllm(cfg.rollout.engine) and stage.data.get("val_engine"):
        with open_dict(stage):
            stage.data.val_engine = OmegaConf.to_container(cfg.rollout.engine, resolve=False)
    return stage


def compose_config(overrides: list[str]) -> DictConfig:
    """conf/config.yaml composed with ``overrides`` (inside a Hydra app: its own search path), its resolvers
    registered (a caller outside train.py, such as the compare tool, reads resolved values)."""
    register_resolvers()
    if GlobalHydra.instance().is_initialized():
        return compose("config", overrides=overrides)
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=overrides)


def _check_one_process(cfg: DictConfig) -> None:
    if cfg.trainer.get("devices", 1) != 1 or cfg.trainer.get("num_nodes", 1) != 1:
        raise ConfigError(
            "warm_start runs in one process: with several devices run the stage first "
            f"(experiment={cfg.warm_start.experiment} export_policy=true), then this run with warm_start=null "
            "model.name_or_path=<that run>/policy model.build_if_missing=false"
        )


def runs_warm_start(cfg: DictConfig) -> bool:
    """Whether the run ``cfg`` is a training run with a ``warm_start`` stage before RL."""
    return bool(cfg.get("warm_start")) and cfg.mode == "train"


def run_warm_start(cfg: DictConfig, user_overrides: Sequence[str], run_stage: Callable[[DictConfig], Any]) -> Path:
    """Run the stage (``run_stage(stage_cfg)``) unless ``RUN_DIR/warm_start/policy`` exists; return that path."""
    _check_one_process(cfg)
    stage_dir = Path(cfg.run_dir) / STAGE_DIR
    policy = stage_dir / layout.POLICY
    if (policy / "config.json").is_file():
        log.info("warm start: reusing the policy in %s", policy)
        return policy
    overrides = stage_overrides(cfg, user_overrides, stage_dir)
    log.info("warm start: python train.py %s", " ".join(scrub_secrets(overrides)))  # the stage runs with the secrets
    run_stage(evaluated_on_run_engine(compose_config(overrides), cfg))
    if not (policy / "config.json").is_file():
        raise UserError(f"the warm start stopped before its last step and exported no policy: rerun with hydra.run.dir={cfg.run_dir}")
    return policy


def start_from(cfg: DictConfig, policy: Path) -> None:
    """Point the run's model (actor, critic backbone, reference) at the warm-started ``policy``."""
    with open_dict(cfg):
        cfg.model.name_or_path = str(policy)
        cfg.model.build_if_missing = False
