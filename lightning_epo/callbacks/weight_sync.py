"""Keeps the generation engines sampling from the actor's current weights."""

from __future__ import annotations

from typing import Any

import lightning as L


class WeightSync(L.Callback):
    """The one route by which the actor's weights reach the DataModule's engines. At setup it hands the DataModule
    the actor (the DataModule binds its engines to it before its first collection: Lightning fetches an evaluation's
    first batch before any hook of the loop runs, and the actor itself is built after setup, in ``configure_model``);
    after every update it pushes the new weights (for the colocated transformers engine a rebind; vLLM copies)."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if trainer.datamodule is not None:
            trainer.datamodule.policy = lambda: pl_module.actor

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        with pl_module.clock.part("weight_sync"):
            trainer.datamodule.sync_weights(pl_module.actor)
