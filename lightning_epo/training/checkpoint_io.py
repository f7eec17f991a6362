"""Checkpoint files written atomically, a cheap check that one is intact, and one that it is safe to load."""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io import TorchCheckpointIO


# the RL steps done at the last evaluation that finished before the checkpoint was written (callbacks/checkpoint.py)
EVALUATED_AT = "evaluated_at"


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's ``torch.save`` checkpoints, written atomically: to a temporary file in the same directory,
    flushed and fsynced, then renamed over the target (``os.replace``). A full disk, a crash or a kill mid-write
    leaves the previous checkpoint as it was and no partial file. Remote paths (``s3://``...) and
    ``storage_options`` go to Lightning's own writer.

    Under DeepSpeed (``trainer=deepspeed_stage_2|3``) this plugin is not used for saving: the DeepSpeed engine
    writes each checkpoint as a directory of shards itself."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        """Write ``checkpoint`` to ``path`` atomically (see the class docstring)."""
        if storage_options is not None or not _is_local_file_protocol(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        try:
            with open(partial, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)  # the rename itself survives a power loss
        finally:
            os.close(directory)


def is_intact(path: Path) -> bool:
    """Whether ``path`` looks like a whole checkpoint, without loading it: a torch zip archive whose central
    directory (written last) opens and lists ``data.pkl``. Directories (DeepSpeed's checkpoints) pass."""
    if path.is_dir():
        return True
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.rpartition("/")[2] == "data.pkl" for name in archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def _read(path: Path) -> Any:
    """A checkpoint file's contents as a safe load gives them (``weights_only=True`` whatever
    ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` says), its tensors left on disk (``mmap``)."""
    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)


def unsafe_content(path: Path) -> str | None:
    """Why the checkpoint file ``path`` must not be resumed from, or None: it holds objects that a safe load
    refuses, or it is not a Lightning checkpoint. Directories (DeepSpeed's) pass."""
    if path.is_dir():
        return None
    try:
        checkpoint = _read(path)
    except pickle.UnpicklingError as error:
        reason = str(error).split("\n")[0].strip()
        return f"holds objects that a safe load refuses ({reason}): resume only from checkpoints you trust"
    if not isinstance(checkpoint, dict) or "pytorch-lightning_version" not in checkpoint:
        return ("is not a Lightning checkpoint (no pytorch-lightning_version): give RUN_DIR/checkpoints/last.ckpt or "
                "rl_step=K.ckpt, or start from plain weights with model.name_or_path=DIR")
    return None


def finished_steps(checkpoint: dict[str, Any]) -> int | None:
    """The RL steps of a run whose checkpoint was written after its last step (Lightning closed its one epoch, and
    a resume with the same loops would train nothing); None for a checkpoint written mid-run."""
    epoch = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_progress", {}).get("current", {})
    return rl_steps(checkpoint) if epoch.get("completed", 0) >= 1 else None


def rl_steps(checkpoint: dict[str, Any]) -> int | None:
    """The RL steps done when the checkpoint was written."""
    return checkpoint.get("rl_state", {}).get("rl_step")


def finished_steps_in(path: Path) -> int | None:
    """:func:`finished_steps` of a checkpoint file (None for DeepSpeed's directories: checked when loaded)."""
    return None if path.is_dir() else finished_steps(_read(path))


def rl_steps_in(path: Path) -> int | None:
    """The RL steps done when the checkpoint file ``path`` was written (None for DeepSpeed's directories)."""
    return None if path.is_dir() else rl_steps(_read(path))


def _lightning_part(path: Path) -> Path | None:
    """The file that holds Lightning's part of the checkpoint at ``path``: the file itself, or in a DeepSpeed
    checkpoint directory its first rank's model states (Lightning's entries are the engine's client state)."""
    return path if not path.is_dir() else next(iter(sorted(path.glob("checkpoint/*mp_rank_00_model_states.pt"))), None)


def recorded_state_settings(path: Path) -> dict[str, Any] | None:
    """The settings that fixed the state of the checkpoint at ``path`` (``state_settings``, see
    lightning_epo/runtime/state_settings.py); None when it records none (written before they were recorded, or a
    DeepSpeed directory whose states a safe load refuses: its loader decides)."""
    part = _lightning_part(path)
    try:
        return _read(part).get("state_settings") if part is not None else None
    except pickle.UnpicklingError:
        return None


def evaluation_due(steps: int, every: int) -> bool:
    """Whether an evaluation follows RL step ``steps`` (counted from 1) in a run that evaluates every ``every`` steps
    (``test_every``, Lightning's ``val_check_interval``; 0 or None: never)."""
    return bool(every) and steps > 0 and steps % every == 0


def unfinished_evaluation(path: Path, every: int) -> int | None:
    """The RL steps K of the checkpoint at ``path`` when the evaluation due after them (K a multiple of ``every``,
    ``test_every``) did not finish: the run stopped in it (a crash, a kill, a preemption). The checkpoint was written
    at step K's end, before the evaluation, and Lightning resumes from it past the evaluation. None otherwise (and
    for a finished run, whose last evaluation ran before its last checkpoint). A checkpoint that records no
    evaluation (:data:`EVALUATED_AT`, written before it was recorded) counts as unevaluated."""
    part = _lightning_part(path)
    try:
        checkpoint = _read(part) if part is not None else {}
    except pickle.UnpicklingError:  # a DeepSpeed directory whose states a safe load refuses: its loader decides
        return None
    steps = checkpoint.get("rl_state", {}).get("rl_step", 0)
    due = evaluation_due(steps, every) and finished_steps(checkpoint) is None
    return steps if due and checkpoint.get(EVALUATED_AT, -1) < steps else None


def reopen_finished_run(checkpoint: dict[str, Any]) -> None:
    """Make the checkpoint of a finished run resume like one written after its last RL step mid-run, so that a larger
    ``total_steps`` (``limit_train_batches``) trains the steps beyond it: the loop progress that
    :class:`lightning_epo.callbacks.checkpoint.RLStepCheckpoint` saves at a batch's end, before Lightning counts the
    batch and the epoch completed (Lightning 2.6's fit-loop state; the exact-resume tests hold it to that form)."""
    fit = checkpoint["loops"]["fit_loop"]
    for scope in ("total", "current"):
        fit["epoch_progress"][scope]["completed"] -= 1
        fit["epoch_progress"][scope]["processed"] -= 1
        fit["epoch_loop.batch_progress"][scope]["completed"] -= 1
    fit["epoch_loop.batch_progress"]["is_last_batch"] = False
    fit["epoch_loop.state_dict"]["_batches_that_stepped"] -= 1
    checkpoint["epoch"] -= 1


def newest_checkpoint(dirpath: str | Path | None) -> Path | None:
    """The most recently written checkpoint (file, or DeepSpeed's directory) in ``dirpath``; None if there is none."""
    if dirpath is None or not Path(dirpath).is_dir():
        return None
    return max(Path(dirpath).glob("*.ckpt"), key=lambda path: path.stat().st_mtime, default=None)


def reopen_if_extended(checkpoint: dict[str, Any], total_steps: int) -> None:
    """Reopen (:func:`reopen_finished_run`) the checkpoint of a finished run that is resumed to train up to a larger
    ``total_steps`` (runtime/config.py's ``check_resume`` said so at start)."""
    done = finished_steps(checkpoint)
    if done is not None and done < total_steps:
        reopen_finished_run(checkpoint)
