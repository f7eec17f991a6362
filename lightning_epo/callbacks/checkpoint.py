"""Checkpoints every N RL steps (Lightning counts optimizer steps, and an RL step holds several)."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightning_epo.training.checkpoint_io import EVALUATED_AT, evaluation_due


class RLStepCheckpoint(ModelCheckpoint):
    """A ModelCheckpoint that saves ``last.ckpt`` (and a periodic ``step=K.ckpt``) after every
    ``every_n_rl_steps`` completed RL steps, at a ``stop_at_step`` stop, after the step in which a preemption
    signal arrived (``trainer.received_sigterm``, see :mod:`lightning_epo.runtime.preemption`) or, where it arrived
    after that step's checkpoint hook had looked, when Lightning stops the run for it (:meth:`on_exception`), before an
    evaluation (``test_every``: a preemption inside it stops the run between two turns, and the resumed run plays it
    from this step), again after that evaluation (recording it), and at the end of training.

    A fresh run in a directory that already holds checkpoints overwrites them (no ``last-v1.ckpt``), so
    ``ckpt_path=last`` always resumes the newest run of that directory."""

    def __init__(self, every_n_rl_steps: int = 1, **kwargs: Any) -> None:
        kwargs.setdefault("filename", "{rl_step}")
        kwargs.setdefault("save_last", True)
        kwargs.setdefault("save_top_k", -1 if kwargs.get("keep_periodic", False) else 1)
        kwargs.pop("keep_periodic", None)
        kwargs.setdefault("enable_version_counter", False)
        super().__init__(every_n_train_steps=0, every_n_epochs=0, save_on_train_epoch_end=False, **kwargs)
        self.every_n_rl_steps = every_n_rl_steps
        self.evaluated_at = -1  # the RL steps done at this process's last finished evaluation (-1: none)

    def _save(self, trainer: L.Trainer) -> None:
        with trainer.lightning_module.clock.part("checkpoint"):
            self._save_now(trainer)

    def _save_now(self, trainer: L.Trainer) -> None:
        candidates = self._monitor_candidates(trainer)
        candidates["rl_step"] = trainer.lightning_module.rl_step
        self._save_topk_checkpoint(trainer, candidates)
        self._save_last_checkpoint(trainer, candidates)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._should_skip_saving_checkpoint(trainer):
            return
        # Any rank's signal: every rank saves (Lightning stops all of them before the next step).
        preempted = trainer.strategy.reduce_boolean_decision(trainer.received_sigterm, all=False)
        evaluates = evaluation_due(pl_module.rl_step, trainer.val_check_batch)  # conf/trainer: test_every
        if pl_module.rl_step % self.every_n_rl_steps == 0 or trainer.should_stop or preempted or evaluates:
            self._save(trainer)
        if preempted and pl_module.rl_step < pl_module.hparams.total_steps:
            # Lightning would play an evaluation due now before it stops (its first split: minutes to an hour of
            # episodes, past a job's grace period); the resumed run plays it first (runtime/run.py). After the last
            # step the evaluation runs: a finished run's checkpoint counts as evaluated.
            trainer.limit_val_batches = 0

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        """Save the completed step that a preemption signal stopped unsaved. Lightning stops a run for the signal
        between two steps (``SIGTERMException``, after the step's last hooks and the loggers' write); a signal that
        arrived after :meth:`on_train_batch_end` had looked (Lightning runs it last of the callbacks; then come the
        module's hook and the loggers' write: milliseconds a step) stopped it with nothing saved since the last periodic
        checkpoint (up to ``every_n_rl_steps - 1`` steps lost).
        Lightning raises it only between steps or evaluation batches (a step's checkpoint is written before its
        evaluation), so an unsaved global step is a completed RL step. One process only: in a distributed run the
        other ranks may not have stopped where this one did, and a save is collective."""
        if isinstance(exception, SIGTERMException) and trainer.world_size == 1 and \
                not self._should_skip_saving_checkpoint(trainer):  # skipped where this global step is saved
            self._save(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Record a finished evaluation; where it follows a step whose checkpoint is written, write that again, so
        that a run resumed from it does not play the evaluation again (training/checkpoint_io.py's
        ``unfinished_evaluation``). After the last step the finished checkpoint follows (:meth:`on_train_end`)."""
        if trainer.sanity_checking:
            return
        self.evaluated_at = pl_module.rl_step
        mid_run = pl_module.rl_step < pl_module.hparams.total_steps
        if trainer.state.fn == "fit" and mid_run and self._last_global_step_saved == trainer.global_step:
            self._save(trainer)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        checkpoint[EVALUATED_AT] = self.evaluated_at

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Save a run that ends between checkpoints, and a run that has trained its ``total_steps`` even where its
        last step's checkpoint is written: only this one records the run as finished (its epoch completed), which a
        resume reads (lightning_epo/runtime/config.py's ``check_resume``)."""
        finished = pl_module.rl_step >= pl_module.hparams.total_steps
        if finished or self._last_global_step_saved != trainer.global_step:
            self._save(trainer)

