"""Make a wandb run readable: the full run config, tags, and metric definitions for the paper's panels."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import lightning as L
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from lightning_epo.callbacks.report_io import wandb_logger
from lightning_epo.core.secrets import scrub_secrets

STEP = "trainer/global_step"  # Lightning's WandbLogger writes the logging step (= RL step k) here


def run_tags(config: Mapping[str, Any]) -> list[str]:
    """``env:<name>``, ``algo:<name>``, ``seed:<n>`` from a run config (the keys that tell runs apart)."""
    env, algo = config.get("env") or {}, config.get("algo") or {}
    tags = {"env": env.get("name"), "algo": algo.get("name"), "seed": config.get("seed")}
    return [f"{key}:{value}" for key, value in tags.items() if value is not None]


class WandbSetup(L.Callback):
    """On fit / validate setup, when the trainer has a WandbLogger (rank 0 only):

    - logs ``config`` (the whole resolved run config, secrets scrubbed) as the wandb run config;
    - adds the tags of :func:`run_tags` (filter and group runs by env, algo, seed);
    - defines the metrics: every ``entropy/*`` panel on the RL-step axis with first/last summaries
      (entropy at the start and end of training, paper Fig. 1 / 7d), and ``val/<split>/success`` with
      ``max`` (Succ.*, the best evaluation) and ``last`` summaries.

    Without a WandbLogger it does nothing, so it can stay in ``callbacks`` with ``logger=csv``.
    """

    def __init__(self, config: Mapping[str, Any] | DictConfig) -> None:
        if isinstance(config, DictConfig):
            config = OmegaConf.to_container(config, resolve=True)
        self.config: dict[str, Any] = scrub_secrets(dict(config))

    @rank_zero_only
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        logger = wandb_logger(trainer)
        if logger is None:
            return
        run = logger.experiment
        run.config.update(self.config, allow_val_change=True)
        run.tags = tuple(sorted(set(run.tags or ()) | set(run_tags(self.config))))
        run.define_metric("entropy/*", step_metric=STEP, step_sync=True, summary="first,last")
        for split in (self.config.get("env") or {}).get("eval_splits") or []:
            run.define_metric(f"val/{split}/success", step_metric=STEP, step_sync=True, summary="max,last")


def finish_wandb_run(failed: bool = False) -> None:
    """Close this process's wandb run, if one is open. Lightning's WandbLogger never does, so without
    this a second run in the same process (a Hydra multirun job, a test) would log into the first."""
    wandb = sys.modules.get("wandb")  # not imported: no run was ever started
    if wandb is not None and wandb.run is not None:
        wandb.finish(exit_code=1 if failed else 0)
