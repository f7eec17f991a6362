"""What a run prints: each library line once, the known-harmless library messages silenced where they come from, and
the closing lines (the run's result, then where its files are)."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import lightning as L
import transformers
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_epo.callbacks.success_report import SuccessReport
from lightning_epo.core.log_filters import silence

# Lightning's warnings that this project's design triggers on purpose (messages as Lightning 2.6 words them).
HARMLESS_LIGHTNING_WARNINGS = (
    # EPOModule.training_step takes the iterator so that Lightning cannot prefetch the next rollout with the old
    # weights; it takes one batch per step, so batch_idx stays right, and its manual optimisation has no accumulation.
    r"You are using the `dataloader_iter` step flavor",
    r"Found `dataloader_iter` argument in the `training_step`",
    # The frozen KL reference (algo.kl_coef > 0) stays in eval mode on purpose (EPOModule.on_train_epoch_start).
    r"Found \d+ module\(s\) in eval mode at the start of training",
    # A resume (ckpt_path=last) mid-"epoch": each batch is drawn from the DataModule's sampler, whose state the
    # checkpoint restores, so the stream continues exactly (tests/integration/test_exact_resume.py).
    r"You're resuming from a checkpoint that ended before the epoch ended",
)
LITLOGGER_TIP = "💡 Tip: For seamless cloud logging"  # an advertisement Lightning logs at INFO on every Trainer


def setup_console() -> None:
    """Call once per process, after Hydra configured logging and before any Trainer: Lightning's lines reach the
    console once, and the libraries' known-harmless messages do not reach it at all."""
    _log_lightning_through_root()
    for message in HARMLESS_LIGHTNING_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    # Lightning 2.6's own pytree helper builds torch's deprecated LeafSpec; nothing to change on this side, and the
    # result is the same until torch removes the class (the pinned torch has it).
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)`", category=FutureWarning)
    silence("lightning.pytorch.utilities.rank_zero", LITLOGGER_TIP)
    # transformers draws a "Loading weights" bar for each model it loads (actor, critic): local weights load in
    # seconds, and redirected to a file each bar is a run of carriage returns. Hub downloads keep huggingface_hub's.
    transformers.utils.logging.disable_progress_bar()


def _log_lightning_through_root() -> None:
    """Lightning gives its ``lightning`` logger a console handler of its own at import (``INFO: ...``) and lets its
    records propagate to the root logger too, which Hydra's job logging prints (and writes to ``train.log``): every
    Lightning line appeared twice. Without a root handler (no Hydra) Lightning's stays."""
    if logging.getLogger().handlers:
        lightning_logger = logging.getLogger("lightning")
        for handler in list(lightning_logger.handlers):
            lightning_logger.removeHandler(handler)


def closing_lines(trainer: L.Trainer, run_dir: Path) -> list[str]:
    """The last lines of a finished fit: validation success at the first and the last evaluation
    (:class:`SuccessReport`), the run directory, the last checkpoint, and the command that draws the figures."""
    lines = [line for callback in trainer.callbacks if isinstance(callback, SuccessReport) for line in callback.lines()]
    lines.append(f"run directory: {run_dir}")
    if isinstance(trainer.checkpoint_callback, ModelCheckpoint) and trainer.checkpoint_callback.last_model_path:
        lines.append(f"checkpoint: {trainer.checkpoint_callback.last_model_path}")
    if trainer.loggers:  # the figures are drawn from the logged history
        lines.append(f"figures: python -m lightning_epo.reports.plot {run_dir} --out {run_dir / 'figures'}")
    return lines
