"""One live run per run directory: ``RUN_DIR/.lock`` names the process that holds it (pid and start time).

A second run on the directory while that process lives is refused in one line; a lock whose process is gone (a
SIGKILL, a crashed node) is taken over with a warning. Only the launching rank takes it: Lightning's second and
later ranks, torchrun's and SLURM's ranks other than 0 run inside the same run. Holding the lock, the run removes
the temporary files of checkpoint writes that a killed run left (``checkpoints/.*.partial``: a 7B's are tens of GB).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import psutil

from lightning_epo.core import layout
from lightning_epo.core.errors import ConfigError

log = logging.getLogger(__name__)
LOCK = ".lock"
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID")


def launching_rank() -> bool:
    """Whether this process is the one that launched the run (rank 0 of node 0, or not yet a rank)."""
    return all(os.environ.get(name, "0") == "0" for name in RANK_VARIABLES)


def _holder_alive(holder: dict) -> bool:
    try:
        process = psutil.Process(holder["pid"])
        return abs(process.create_time() - holder["started"]) < 1.0  # not a later process with a reused pid
    except (psutil.NoSuchProcess, KeyError, TypeError):
        return False


class RunDirLock:
    """``with RunDirLock(run_dir):`` the run; the lock goes on every exit but a SIGKILL (then it is stale)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK
        self.held = False

    def __enter__(self) -> RunDirLock:
        if not launching_rank():
            return self
        me = {"pid": os.getpid(), "started": psutil.Process().create_time()}
        while not self.held:
            try:
                with open(self.path, "x") as f:  # O_EXCL: of two runs starting at once, one creates it
                    json.dump(me, f)
                self.held = True
            except FileExistsError:
                self._take_over_if_stale()
        for partial in (self.path.parent / layout.CHECKPOINTS).glob(".*.partial"):
            log.warning("removing %s, left by a checkpoint write that did not finish", partial)
            partial.unlink(missing_ok=True)
        return self

    def _take_over_if_stale(self) -> None:
        try:
            holder = json.loads(self.path.read_text())
        except (OSError, ValueError):  # being written by a run starting this instant, or damaged
            holder = {"pid": "?", "fresh": time.time() - self.path.stat().st_mtime < 10} if self.path.exists() else {}
        if holder.get("fresh") or _holder_alive(holder):
            raise ConfigError(
                f"run directory {self.path.parent} is in use by a live run (pid {holder['pid']}): wait for it to end, "
                "or give this run another hydra.run.dir"
            )
        log.warning("taking over %s from pid %s, which is no longer running", self.path, holder.get("pid"))
        self.path.unlink(missing_ok=True)

    def __exit__(self, *exc: object) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False
