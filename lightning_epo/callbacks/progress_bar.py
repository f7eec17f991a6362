"""Lightning's rich progress bar, cut down so that an RL run's bar stays on one line, with an evaluation's episodes."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.callbacks.progress.rich_progress import ProcessingSpeedColumn
from rich.progress import BarColumn

from lightning_epo.core.metric_names import PROGRESS_BAR
from lightning_epo.rollout.eval_progress import EvalProgress

BAR_WIDTH = 15  # characters; Lightning's grows to 40 and squeezes the metrics into a column of wrapped lines


class RLProgressBar(RichProgressBar):
    """Lightning's RichProgressBar with the metrics of :data:`PROGRESS_BAR` under their short names (and not the
    logger's ``v_num``), a shorter bar, and no batches-per-second column (an RL step takes seconds to minutes: it
    read ``0.00it/s``). On an 80-column terminal it is one line, where Lightning's wraps one metric value per line.

    An evaluation split is one batch to Lightning, played in minutes to an hour: the bar shows its episodes instead
    (``iid episodes, success 0.78  40/100  0:01:02 • 0:01:33``: finished of the split's, elapsed, time left), fed by
    the DataModule after each turn that ended episodes (``RolloutDataModule.eval_listeners``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._episodes_task: Any = None
        self._episodes_split: str | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        listeners = getattr(trainer.datamodule, "eval_listeners", None)
        if listeners is not None and self.show_episodes not in listeners:
            listeners.append(self.show_episodes)

    def show_episodes(self, progress: EvalProgress) -> None:
        """Show ``progress`` (one split's evaluation) as a task of the bar, replacing the previous split's."""
        if self.is_disabled:
            return
        if self.progress is None or self._progress_stopped:  # the first batch plays before on_validation_start
            self._init_progress(self.trainer)
            self._episodes_task = self._episodes_split = None
        if progress.split != self._episodes_split:
            self._hide_episodes()
            self._episodes_task = self._add_task(progress.total, f"{progress.split} episodes")
            self._episodes_split = progress.split
        self.progress.update(self._episodes_task, completed=progress.done,
                             description=f"{progress.split} episodes, success {progress.success:.2f}")
        self.refresh()

    def _hide_episodes(self) -> None:
        if self.progress is not None and self._episodes_task is not None:
            self.progress.update(self._episodes_task, visible=False)
        self._episodes_task = self._episodes_split = None

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._hide_episodes()
        super().on_validation_end(trainer, pl_module)

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        return {short: metrics[name] for name, short in PROGRESS_BAR.items() if name in metrics}

    def configure_columns(self, trainer: L.Trainer) -> list:
        columns = [c for c in super().configure_columns(trainer) if not isinstance(c, ProcessingSpeedColumn)]
        for column in columns:
            if isinstance(column, BarColumn):
                column.bar_width = BAR_WIDTH
        return columns
