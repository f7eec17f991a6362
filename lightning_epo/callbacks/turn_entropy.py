"""Entropy by turn position: the mean old-policy token entropy of each turn index, every RL step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from lightning_epo.callbacks.report_io import append_jsonl, wandb_logger
from lightning_epo.core import layout


class TurnEntropyLog(L.Callback):
    """After RL step k, appends ``{"step": k, "entropy": [H_turn0, H_turn1, ...]}`` (the module's
    step report's ``turn_entropy``, all ranks; null for a turn index no response reached) to
    ``RUN_DIR/turn_entropy.jsonl`` (read by ``python -m lightning_epo.reports.plot``), and with a WandbLogger
    logs it as the table ``tables/turn_entropy`` (columns turn, entropy, step) for an entropy-by-turn panel."""

    def __init__(self, run_dir: str, wandb_key: str = "tables/turn_entropy") -> None:
        self.path = Path(run_dir) / layout.TURN_ENTROPY
        self.wandb_key = wandb_key

    @rank_zero_only
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        report = pl_module.step_report
        step, entropy = report.rl_step, list(report.turn_entropy)
        append_jsonl(self.path, [{"step": step, "entropy": entropy}])
        logger = wandb_logger(trainer)
        if logger is not None:
            rows = [[turn, value, step] for turn, value in enumerate(entropy)]
            logger.log_table(self.wandb_key, columns=["turn", "entropy", "step"], data=rows, step=step)
