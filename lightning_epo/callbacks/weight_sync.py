"""Keeps the generation engine sampling from the actor's current weights."""

from __future__ import annotations

from typing import Any

import lightning as L


class WeightSync(L.Callback):
    """Pushes the actor's weights to the DataModule's engines after every update (for the colocated
    transformers engine this is a rebind; vLLM copies). The DataModule binds them before its first rollout."""

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        with pl_module.clock.part("weight_sync"):
            trainer.datamodule.sync_weights(pl_module.actor)
