"""``python train.py`` run as a user runs it, for the tests that read what a command printed or logged."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def train(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "train.py"), *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def last_line(text: str) -> str:
    return [line for line in text.splitlines() if line.strip()][-1]


# Lightning's line for ``L.seed_everything``, which a run logs right before it builds its data, module and trainer
# (tests/integration/test_console.py checks that a run that starts logs it).
RUN_STARTED = "Seed set to"


def refused_before_the_run_began(run_dir: Path) -> bool:
    """The run's ``train.log`` ends before the run seeded itself: "at start" read from the log, not from the clock
    (importing torch, Lightning and transformers alone takes ~15 s on a busy 2-core machine)."""
    return RUN_STARTED not in (run_dir / "train.log").read_text()
