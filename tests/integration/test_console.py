"""What ``python train.py`` prints, read as a user reads it: each line once, no library paths or known-harmless
library chatter, a line per evaluation, and the run ending with its results and where its files are."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.train_command import refused_before_the_run_began

REPO = Path(__file__).resolve().parents[2]
# The default run (experiment=quickstart, logger=wandb) cut short: three evaluations (val_at_start's, then after RL
# steps 1 and 2) on tiny batches.
SHORT_RUN = ["debug=fast", "logger=wandb", "total_steps=2", "test_every=1", "val_at_start=true", "env.val_size=4"]
LOG_PREFIX = re.compile(r"^\[[^\]]*\]\[[^\]]*\]\[[A-Z]+\] - |^(INFO|WARNING|ERROR): ")  # Hydra's, and Lightning's own
NOISE = ("Loading weights", "litlogger", "Here be dragons", "LeafSpec", "The anonymous setting")


def message(line: str) -> str:
    """A console line without its logging prefix (Hydra's ``[time][name][LEVEL] - `` or Lightning's ``INFO: ``)."""
    return LOG_PREFIX.sub("", line).strip()


@pytest.fixture(scope="module")
def console(tmp_path_factory) -> tuple[list[str], Path]:
    """The lines of the short run's stdout and stderr, in the order printed, and its run directory."""
    run_dir = tmp_path_factory.mktemp("console") / "run"
    # COLUMNS: the width rich draws the progress bar for (not a terminal here; 80, a terminal's classic default).
    # Unbuffered: stdout and stderr interleave as they were written.
    env = {**os.environ, "COLUMNS": "80", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "train.py", *SHORT_RUN, f"hydra.run.dir={run_dir}"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    return proc.stdout.splitlines(), run_dir


def test_every_line_is_printed_once(console):
    lines, _ = console
    # The progress bar's lines (its redraws) and wandb's blank "wandb:" spacers are not messages.
    messages = [message(line) for line in lines if "━" not in line]
    messages = [m for m in messages if m not in ("", "wandb:")]
    repeated = sorted({m for m in messages if messages.count(m) > 1})
    assert not repeated, repeated


def test_no_library_paths_and_no_known_harmless_chatter(console):
    lines, _ = console
    assert not [line for line in lines if "site-packages" in line]
    assert not [line for line in lines if any(noise in line for noise in NOISE)]


def test_the_progress_bar_keeps_its_metrics_on_one_line(console):
    """Metrics that do not fit are wrapped by rich into a column of indented lines under the bar."""
    lines, _ = console
    assert not [line for line in lines if re.match(r"\s{20,}\S", line)]


def test_each_evaluation_says_what_it_measured(console):
    lines, _ = console
    text = "\n".join(message(line) for line in lines)
    for step in (0, 1, 2):  # val_at_start's, then every test_every=1 RL steps
        assert re.search(rf"^evaluation at RL step {step}: val/iid/success \d\.\d\d, val/ood/success \d\.\d\d$",
                         text, re.MULTILINE), text[-3000:]


def test_the_run_ends_with_its_results_and_where_its_files_are(console):
    lines, run_dir = console
    last = [message(line) for line in lines if line.strip()][-5:]
    assert re.fullmatch(r"val/iid/success \d\.\d\d at RL step 0 -> \d\.\d\d at RL step 2", last[0]), last
    assert re.fullmatch(r"val/ood/success \d\.\d\d at RL step 0 -> \d\.\d\d at RL step 2", last[1]), last
    assert last[2] == f"run directory: {run_dir}", last
    assert last[3] == f"checkpoint: {run_dir / 'checkpoints' / 'last.ckpt'}", last
    assert last[4] == f"figures: python -m lightning_epo.reports.plot {run_dir} --out {run_dir / 'figures'}", last
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert not refused_before_the_run_began(run_dir)  # the marker the start-time refusal tests look for
