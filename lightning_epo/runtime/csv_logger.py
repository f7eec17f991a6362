"""``logger=csv`` that keeps a resumed run's earlier rows.

Lightning's CSVLogger deletes ``metrics.csv`` whenever a new process opens an existing log directory,
so ``ckpt_path=last`` lost every row logged before the interruption. Here a run that resumes
(``resume_from`` is its ``ckpt_path``) appends to the file instead; a fresh run still starts a new one.
Steps logged twice (after the last checkpoint, then again after the resume) keep their newest value in
:func:`lightning_epo.reports.run_history.read_csv_history`.
"""

from __future__ import annotations

import csv
from typing import Any

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter


class _AppendingWriter(ExperimentWriter):
    """Keeps an existing ``metrics.csv`` and its columns, so new rows are appended under the same header."""

    def _check_log_dir_exists(self) -> None:
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as f:
                self.metrics_keys = next(csv.reader(f), [])


class ResumableCSVLogger(CSVLogger):
    """Lightning's CSVLogger; with ``resume_from`` set (a resumed run) earlier rows are kept."""

    def __init__(self, *args: Any, resume_from: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.resume_from = resume_from

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            writer = _AppendingWriter if self.resume_from is not None else ExperimentWriter
            self._experiment = writer(log_dir=self.log_dir)
        return self._experiment
