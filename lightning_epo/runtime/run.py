"""Compose the objects of a run from the config, then fit or evaluate (the wiring behind train.py)."""

from __future__ import annotations

import json
import logging
from functools import partial
from pathlib import Path

import hydra
import lightning as L
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig

from lightning_epo.callbacks.wandb_setup import finish_wandb_run
from lightning_epo.core import layout
from lightning_epo.models.loading import model_source
from lightning_epo.models.trained_on import other_environment_line
from lightning_epo.runtime.config import check_machine, check_prompt_room, check_resume, resolve_ckpt_path, validate
from lightning_epo.runtime.console import closing_lines
from lightning_epo.runtime.engine_choice import choose_engine
from lightning_epo.runtime.machine_record import record_machine
from lightning_epo.runtime.resolvers import register_resolvers
from lightning_epo.runtime.run_dir_lock import RunDirLock
from lightning_epo.runtime.shared_engine import SharedEngine, shared_by_stages
from lightning_epo.runtime.state_settings import check_checkpoint_settings, state_settings
from lightning_epo.runtime.warm_start import command_line_overrides, run_warm_start, runs_warm_start, start_from
from lightning_epo.training.checkpoint_io import unfinished_evaluation

log = logging.getLogger(__name__)
register_resolvers()  # ${run_id:...} and ${run_config:} in the configs


def build_callbacks(cfg: DictConfig) -> list[L.Callback]:
    return [hydra.utils.instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c and "_target_" in c]


def build_logger(cfg: DictConfig):
    return hydra.utils.instantiate(cfg.logger) if cfg.get("logger") and "_target_" in cfg.logger else False


def run(cfg: DictConfig, overrides: list[str] | None = None, shared: SharedEngine | None = None) -> dict[str, float]:
    """Train (``mode=train``, after the ``warm_start`` stage if any) or evaluate (``mode=eval``, writing
    ``eval.json``); returns the final metrics. ``overrides``: the command line's (for the warm start to inherit);
    ``shared``: the vLLM engine of the run a warm start belongs to (runtime/shared_engine.py)."""
    log.info(choose_engine(cfg))
    validate(cfg)
    check_machine(cfg)
    # The tiny model is built here, once, before any trainer starts: inside the module's configure_model a
    # ZeRO-3 rank would build it under zero.Init (empty parameter shards), several ranks at once.
    model_source(cfg.model)
    check_prompt_room(cfg)  # needs the model's tokenizer
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with RunDirLock(run_dir), shared_by_stages(cfg, shared) as shared:
        return _train_or_evaluate(cfg, run_dir, overrides, shared)


def _train_or_evaluate(cfg: DictConfig, run_dir: Path, overrides: list[str] | None,
                       shared: SharedEngine | None) -> dict[str, float]:
    ckpt_path = resolve_ckpt_path(cfg.ckpt_path, run_dir)
    check_resume(ckpt_path, cfg)
    record_machine(cfg, run_dir, resumed=ckpt_path is not None)
    if runs_warm_start(cfg):
        user_overrides = command_line_overrides() if overrides is None else overrides
        start_from(cfg, run_warm_start(cfg, user_overrides, run_stage=partial(run, shared=shared)))
    settings = state_settings(cfg)  # after the warm start: the model is its policy
    smoke_run = other_environment_line(cfg.model.name_or_path, cfg.env.name, cfg.env.recipes)
    if smoke_run is not None:
        log.warning(smoke_run)
    check_checkpoint_settings(ckpt_path, settings)
    if cfg.get("torch_threads"):
        torch.set_num_threads(cfg.torch_threads)
    L.seed_everything(cfg.seed, workers=True)
    try:
        datamodule = hydra.utils.instantiate(cfg.data, **(shared.datamodule_engines(cfg.data) if shared else {}))
        module = hydra.utils.instantiate(cfg.module, state_settings=settings)
        # An evaluation reports in eval.json (conf/config.yaml: mode): logged, it would land at step 0 of the
        # evaluated run's own history (csv, and wandb, whose run id is the run directory's) over val_at_start's point.
        logger = build_logger(cfg) if cfg.mode == "train" else False
        trainer: L.Trainer = hydra.utils.instantiate(cfg.trainer, callbacks=build_callbacks(cfg), logger=logger)
        if cfg.mode == "eval":
            results = trainer.validate(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
            metrics = {k: float(v) for split in results for k, v in split.items()}
            if trainer.is_global_zero:  # the metrics are reduced over ranks: one writer
                (run_dir / layout.EVAL).write_text(json.dumps(metrics, indent=2, sort_keys=True))
                log.info("wrote %s", run_dir / layout.EVAL)
            return metrics
        unfinished = unfinished_evaluation(Path(ckpt_path), cfg.test_every) if ckpt_path is not None else None
        if unfinished is not None:
            log.info("the evaluation after %d RL steps did not finish before the run stopped: playing it first",
                     unfinished)
        if (cfg.val_at_start and ckpt_path is None) or unfinished is not None:
            datamodule.fit_follows = True  # fit reuses the evaluation's engines and environments
            trainer.validate(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True,
                             verbose=False)  # SuccessReport logs its line, no table
            datamodule.fit_follows = False
            # a signal after the evaluation's last episode: fit would clear Lightning's flag and train on
            if trainer.strategy.reduce_boolean_decision(trainer.received_sigterm, all=False):
                datamodule.teardown("fit")
                raise SIGTERMException  # preemption.py: the run stops, 143 / 130
        # weights_only passed, not left to torch's default, which TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 turns off
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
    except BaseException:
        finish_wandb_run(failed=True)
        raise
    finally:
        finish_wandb_run()  # Lightning never closes the wandb run; a second run in this process would reuse it
    if trainer.is_global_zero:  # after the progress bar and wandb's last words: the run's last lines
        for line in closing_lines(trainer, run_dir) + ([smoke_run] if smoke_run is not None else []):
            log.info(line)
    return {k: float(v) for k, v in trainer.callback_metrics.items()}
