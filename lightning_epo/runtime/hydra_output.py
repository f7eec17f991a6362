"""A Hydra callback that keeps secrets off Hydra's own files and log lines: the files are rewritten scrubbed before
any job code runs, no signal can stop the process while they still hold a secret, and log records are made redacted.

Hydra saves the config and the command line as typed (a ``+model.token=hf_...`` included): each job's
``.hydra/{config,hydra,overrides}.yaml`` right before the job starts, and a sweep's ``multirun.yaml`` before its
first job. ``on_job_start`` runs right after, before the task function (``train.py``'s ``main``, which spends
seconds importing before anything else), and scrubs them all. From the start of the run (or sweep) until then, and
between the jobs of a sweep, SIGTERM and SIGINT are held and act once the files are scrubbed: the process stops with
status 128 + the signal's number, as :class:`~lightning_epo.runtime.preemption.Preemption` stops a run outside a
trainer call (whose handlers replace these while a job runs).

Hydra also logs each job's overrides as it launches a sweep (a job script's output file keeps them): from the start
of the run every log record is made with its secrets redacted (console, ``train.log``).
"""

from __future__ import annotations

import signal
from pathlib import Path
from types import FrameType
from typing import Any

from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from lightning_epo.core.secrets import scrub_log_records, scrub_saved_config
from lightning_epo.runtime.preemption import SIGNALS


def saved_config_files(config: DictConfig) -> list[Path]:
    """The files Hydra has saved for the job of ``config``: its ``.hydra/*.yaml`` (unless ``hydra.output_subdir``
    is null) and, in a sweep, ``multirun.yaml``."""
    hydra = config.hydra
    files = []
    if hydra.output_subdir is not None:
        files += sorted((Path(hydra.runtime.output_dir) / hydra.output_subdir).glob("*.yaml"))
    if hydra.mode == RunMode.MULTIRUN:
        files.append(Path(hydra.sweep.dir) / "multirun.yaml")
    return [path for path in files if path.is_file()]


class ScrubHydraOutput(Callback):
    """See the module docstring. ``held``: the first signal received before the files were scrubbed."""

    def __init__(self) -> None:
        self.scrubbed = False
        self.held: int | None = None
        self._previous: dict[int, Any] = {}

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._install()

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._install()

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        for path in saved_config_files(config):
            scrub_saved_config(path)
        self.scrubbed = True
        self._stop_if_held()

    def on_job_end(self, config: DictConfig, **kwargs: Any) -> None:
        self.scrubbed = False  # a sweep's next job: its files are saved before its on_job_start

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._restore()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._restore()

    def _install(self) -> None:
        """At the start of a run or sweep: log records made redacted, SIGTERM / SIGINT routed to :meth:`_on_signal`."""
        scrub_log_records()
        self._previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
        for signum in SIGNALS:
            signal.signal(signum, self._on_signal)

    def _restore(self) -> None:
        """At its end: the handlers it found back; a signal still held stops the process."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._stop_if_held()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """Before the files are scrubbed: hold the signal; after: stop now (no trainer runs yet)."""
        self.held = self.held or signum
        if self.scrubbed:
            self._stop_if_held()

    def _stop_if_held(self) -> None:
        if self.held is not None:
            raise SystemExit(128 + self.held)
