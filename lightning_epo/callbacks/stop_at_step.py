"""``stop_at_step=S``: end the run after S completed RL steps, as a time-limited cluster job would."""

from __future__ import annotations

from typing import Any

import lightning as L

from lightning_epo.training.checkpoint_io import evaluation_due


class StopAtStep(L.Callback):
    """Sets ``trainer.should_stop`` once the module has completed ``stop_at_step`` RL steps (None: never).
    The schedules keep using ``total_steps``; RLStepCheckpoint saves ``last.ckpt`` at that step.

    Lightning 2.6 validates whenever ``should_stop`` is set (it is EarlyStopping's signal), whatever
    ``val_check_interval`` says: a stop after a step that ``test_every`` evaluates after keeps its evaluation, any
    other stop turns validation off (``limit_val_batches=0``) for the rest of the trainer's life, which ends there."""

    def __init__(self, stop_at_step: int | None = None) -> None:
        self.stop_at_step = stop_at_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.stop_at_step is not None and pl_module.rl_step >= self.stop_at_step:
            trainer.should_stop = True
            if not evaluation_due(pl_module.rl_step, trainer.val_check_batch):  # conf/trainer: test_every
                trainer.limit_val_batches = 0
