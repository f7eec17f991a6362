"""One live run per run directory: a second run is refused in one line while the first lives, a dead run's lock is
taken over, and the temporary files of a killed checkpoint write are removed at start."""

from __future__ import annotations

import json
import subprocess
import sys

import psutil
import pytest

from lightning_epo.runtime.run import run
from lightning_epo.runtime.run_dir_lock import LOCK
from tests.integration.train_command import last_line, train

FAST = ["debug=fast", "logger=csv", "~callbacks.progress_bar", "test_every=1000"]


def hold_lock(run_dir, process) -> None:
    """``RUN_DIR/.lock`` as the run of ``process`` writes it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    started = psutil.Process(process.pid).create_time()
    (run_dir / LOCK).write_text(json.dumps({"pid": process.pid, "started": started}))


def test_a_second_run_on_a_live_runs_directory_is_one_line(tmp_path):
    run_dir = tmp_path / "run"
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) as live:
        hold_lock(run_dir, live)
        result = train("~experiment", *FAST, f"hydra.run.dir={run_dir}")
        live.kill()
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert last_line(result.stderr) == (f"error: run directory {run_dir} is in use by a live run (pid {live.pid}): "
                                        "wait for it to end, or give this run another hydra.run.dir")
    assert not (run_dir / "checkpoints").exists()  # it wrote nothing


def test_a_dead_runs_lock_is_taken_over_and_its_partial_checkpoints_removed(compose_cfg, tmp_path):
    run_dir = tmp_path / "run"
    with subprocess.Popen([sys.executable, "-c", "pass"]) as dead:
        hold_lock(run_dir, dead)
    partial = run_dir / "checkpoints" / f".rl_step=2.ckpt.{dead.pid}.partial"  # a SIGKILL mid-write
    partial.parent.mkdir()
    partial.write_bytes(b"PK half a checkpoint")
    metrics = run(compose_cfg("~experiment", *FAST))
    assert "loss/total" in metrics
    assert not partial.exists() and not (run_dir / LOCK).exists()  # removed, and the lock released at the end
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()


def test_the_lock_is_released_when_the_run_fails(compose_cfg, tmp_path, monkeypatch):
    import lightning_epo.runtime.run as run_lib

    def broken(*args, **kwargs):
        raise RuntimeError("the trainer died")

    monkeypatch.setattr(run_lib, "build_callbacks", broken)
    with pytest.raises(RuntimeError, match="the trainer died"):
        run(compose_cfg("~experiment", *FAST))
    assert not (tmp_path / "run" / LOCK).exists()
