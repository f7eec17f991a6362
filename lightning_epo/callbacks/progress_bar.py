"""Lightning's rich progress bar, cut down so that an RL run's bar stays on one line."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.callbacks.progress.rich_progress import ProcessingSpeedColumn
from rich.progress import BarColumn

from lightning_epo.core.metric_names import PROGRESS_BAR

BAR_WIDTH = 15  # characters; Lightning's grows to 40 and squeezes the metrics into a column of wrapped lines


class RLProgressBar(RichProgressBar):
    """Lightning's RichProgressBar with the metrics of :data:`PROGRESS_BAR` under their short names (and not the
    logger's ``v_num``), a shorter bar, and no batches-per-second column (an RL step takes seconds to minutes: it
    read ``0.00it/s``). On an 80-column terminal it is one line, where Lightning's wraps one metric value per line."""

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        return {short: metrics[name] for name, short in PROGRESS_BAR.items() if name in metrics}

    def configure_columns(self, trainer: L.Trainer) -> list:
        columns = [c for c in super().configure_columns(trainer) if not isinstance(c, ProcessingSpeedColumn)]
        for column in columns:
            if isinstance(column, BarColumn):
                column.bar_width = BAR_WIDTH
        return columns
