"""``export_policy=true``: the trained actor as a Hugging Face model directory (a warm start's product)."""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L

from lightning_epo.models.export import export_policy
from lightning_epo.models.lora import adapter_parameters
from lightning_epo.models.shards import gathered
from lightning_epo.models.weights import hf_weights
from lightning_epo.training.distributed import zero_stage

log = logging.getLogger(__name__)


class ExportPolicy(L.Callback):
    """When a run completes all ``total_steps`` RL steps, saves the actor and the tokenizer to ``dirpath``
    (``RUN_DIR/policy``), loadable by a later run with ``model.name_or_path=RUN_DIR/policy`` (with LoRA: the merged
    model, and the adapter alone in ``RUN_DIR/policy/adapter``).

    A run that stops early (``stop_at_step``, a crash) exports nothing, so the directory only ever holds a
    finished policy. Under ZeRO-3 every rank takes part (shards are gathered one parameter at a time into a
    copy on rank 0); otherwise rank 0 saves the actor's own tensors, with no copy. Rank 0 writes.
    """

    def __init__(self, dirpath: str, total_steps: int, enabled: bool = True, env: str | None = None) -> None:
        """``env``: the environment trained on, recorded with the policy (lightning_epo/models/trained_on.py)."""
        self.dirpath, self.env = Path(dirpath), env
        self.total_steps = total_steps
        self.enabled = enabled

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.enabled:
            return
        if pl_module.rl_step < self.total_steps:
            log.info("stopped at RL step %d of %d: no policy exported", pl_module.rl_step, self.total_steps)
            return
        weights = None
        if zero_stage(trainer.strategy) == 3:
            weights = {name: tensor for name, tensor in hf_weights(pl_module.actor) if trainer.is_global_zero}
        with gathered(adapter_parameters(pl_module.actor)):  # LoRA under ZeRO-3: the adapters' full tensors
            if trainer.is_global_zero:
                export_policy(pl_module.actor, trainer.datamodule.tokenizer, self.dirpath, state_dict=weights,
                              env=self.env)
                log.info("exported the policy to %s", self.dirpath)
        trainer.strategy.barrier()
