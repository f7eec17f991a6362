"""A Hydra callback that refuses a run directory that cannot be written, at start, with one line.

Hydra creates the run directory and writes ``.hydra/`` there before ``train.py``'s code runs, so without this a
read-only or impossible ``hydra.run.dir`` ends in Hydra's stack trace.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from lightning_epo.core.errors import exit_with_error


def unwritable_reason(directory: Path) -> str | None:
    """Why ``directory`` could not be created and written, or None when it could: a folder is created and
    removed in its nearest existing ancestor (``os.access`` says yes to root on a read-only mount). The directory
    itself is left for Hydra to create: its name may hold a time stamp that Hydra resolves again."""
    existing = directory.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".write_probe_", dir=existing))
    except OSError as exc:
        return f"{existing}: {exc.strerror}"
    return None


class RunDirCheck(Callback):
    """Before Hydra creates the run (or sweep) directory: ``error: ...`` and exit status 2 when it cannot."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check(config, "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check(config, "hydra.sweep.dir")


def _check(config: DictConfig, key: str) -> None:
    directory = Path(str(OmegaConf.select(config, key)))
    reason = unwritable_reason(directory)
    if reason is not None:
        exit_with_error(f"cannot write the run directory {directory} ({reason}): set {key}=<a writable directory>")
