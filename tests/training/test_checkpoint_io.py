"""Checkpoints are written atomically; ``ckpt_path=last`` falls back to the newest intact ``rl_step=K.ckpt`` when
``last.ckpt`` is damaged or missing; a damaged explicit ``ckpt_path`` fails with one line."""

from __future__ import annotations

import logging
import subprocess

import pytest
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from lightning_epo.runtime.run import run
from lightning_epo.training.checkpoint_io import AtomicCheckpointIO, evaluation_due, is_intact
from tests.integration.train_command import last_line, train
from tests.integration.test_exact_resume import FAST, logged


@pytest.mark.parametrize(("steps", "every", "due"), [(4, 2, True), (3, 2, False), (0, 2, False), (4, 0, False),
                                                     (4, None, False), (1, 1, True)])
def test_an_evaluation_is_due_after_the_steps_that_test_every_divides(steps, every, due):
    assert evaluation_due(steps, every) is due


def test_a_failed_write_leaves_the_previous_checkpoint_and_no_partial_file(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"step": 1}, path)

    def full_disk(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError, match="No space left"):
        AtomicCheckpointIO().save_checkpoint({"step": 2}, path)

    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]
    assert torch.load(path, weights_only=True) == {"step": 1}


def test_damaged_last_ckpt_resumes_from_the_newest_intact_periodic_one(compose_cfg, tmp_path, caplog):
    run_dir = tmp_path / "run"
    run(compose_cfg(*FAST, "stop_at_step=5", f"run_dir={run_dir}"))  # rl_step=5.ckpt and last.ckpt
    last = run_dir / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])  # a full disk's truncated write

    with caplog.at_level(logging.WARNING):
        run(compose_cfg(*FAST, "ckpt_path=last", f"run_dir={run_dir}"))

    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "last.ckpt" in r.getMessage()]
    assert len(warnings) == 1 and "rl_step=5.ckpt" in warnings[0], warnings
    assert set(logged(run_dir)) == set(range(6))  # steps 0-4 from the first run, 5 from the resumed one


def test_missing_last_ckpt_resumes_from_the_newest_intact_periodic_one(compose_cfg, tmp_path, caplog):
    """``last.ckpt`` deleted (a cleanup, a partial copy of the run directory) with ``rl_step=5.ckpt`` beside it:
    resumed from that, as from a damaged one, instead of "last.ckpt does not exist: pass hydra.run.dir"."""
    run_dir = tmp_path / "run"
    run(compose_cfg(*FAST, "stop_at_step=5", f"run_dir={run_dir}"))
    (run_dir / "checkpoints" / "last.ckpt").unlink()

    with caplog.at_level(logging.WARNING):
        run(compose_cfg(*FAST, "ckpt_path=last", f"run_dir={run_dir}"))

    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "last.ckpt" in r.getMessage()]
    assert len(warnings) == 1 and "is missing" in warnings[0] and "rl_step=5.ckpt" in warnings[0], warnings
    assert set(logged(run_dir)) == set(range(6))


def test_garbage_ckpt_path_fails_with_one_line_naming_the_file(tmp_path):
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"not a checkpoint" * 100)

    result = train(f"ckpt_path={garbage}", f"hydra.run.dir={tmp_path}")

    assert result.returncode == 2
    assert last_line(result.stderr).startswith(f"error: ckpt_path '{garbage}' is not an intact checkpoint")
    assert "Traceback" not in result.stderr and "weights_only" not in result.stderr


@pytest.fixture
def small_disk(tmp_path):
    """A 6 MiB tmpfs: a real full disk (needs the right to mount, as root in a container; skipped otherwise)."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mount_point)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    yield mount_point
    subprocess.run(["umount", str(mount_point)], check=True)


@pytest.mark.parametrize("writer", [TorchCheckpointIO, AtomicCheckpointIO])
def test_a_full_disk_leaves_the_previous_last_ckpt_intact(small_disk, writer):
    path = small_disk / "last.ckpt"
    writer().save_checkpoint({"weights": torch.ones(2**20 // 4)}, path)  # 1 MiB: the previous checkpoint
    (small_disk / "filler").write_bytes(b"\0" * 2**20 * 3)  # the run's other files: 2 MiB free
    with pytest.raises((OSError, RuntimeError)):  # torch's zip writer reports ENOSPC as a RuntimeError
        writer().save_checkpoint({"weights": torch.ones(2**20 * 3 // 4)}, path)  # 3 MiB do not fit

    if writer is TorchCheckpointIO:  # Lightning's writer truncates the file it replaces: the probe
        assert not is_intact(path)
    else:
        assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "last.ckpt"]
        assert torch.load(path, weights_only=True)["weights"].numel() == 2**20 // 4
