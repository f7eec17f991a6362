"""Read a finished (or running) run's logged metrics and config back from its run directory.

Two sources, both written under ``RUN_DIR`` by the loggers:

- ``logger=csv``: ``RUN_DIR/csv/metrics.csv`` (Lightning's CSVLogger; column ``step`` is the RL step).
- ``logger=wandb``: ``RUN_DIR/wandb/*run-*/run-*.wandb``, wandb's transaction log. The pinned wandb
  (0.31) writes it from its Go core and no longer ships the Python reader (``wandb.sdk.internal.datastore``
  is gone), so :func:`wandb_records` parses the format itself: a leveldb log
  (https://github.com/google/leveldb/blob/main/doc/log_format.md) with a 7-byte ``:W&B`` header and
  zlib CRC-32 checksums, whose payloads are ``wandb_internal_pb2.Record``s.
  Lightning's WandbLogger writes the RL step as ``trainer/global_step``; a resumed run (same id) adds
  another ``*run-*`` folder, read in time order, so later values of a step replace earlier ones.
"""

from __future__ import annotations

import csv
import json
import statistics
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import yaml

from lightning_epo.core.errors import UserError

Series = list[tuple[int, float]]  # (RL step, value), sorted by step

_HEADER = struct.Struct("<4sHB")  # ident, magic, version
_RECORD = struct.Struct("<IHB")  # crc32, length, type
_BLOCK = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4
_MAGIC = 0xBEE1
_TYPE_CRC = {t: zlib.crc32(bytes([t])) for t in (_FULL, _FIRST, _MIDDLE, _LAST)}
_WANDB_INTERNAL = {"_step", "_runtime", "_timestamp", "trainer/global_step", "epoch"}


def _leveldb_payloads(data: bytes, name: str) -> Iterator[bytes]:
    """The logical records of a leveldb log; stops quietly at a truncated tail (a run still writing)."""
    pos, pending = _HEADER.size, b""
    while pos + _RECORD.size <= len(data):
        left_in_block = _BLOCK - pos % _BLOCK
        if left_in_block < _RECORD.size:  # block trailer: zero padding
            pos += left_in_block
            continue
        crc, length, kind = _RECORD.unpack_from(data, pos)
        chunk = data[pos + _RECORD.size : pos + _RECORD.size + length]
        if len(chunk) < length:
            return
        if kind not in _TYPE_CRC or zlib.crc32(chunk, _TYPE_CRC[kind]) != crc:
            raise UserError(f"{name} is corrupt at byte {pos} (checksum mismatch): it cannot be read")
        pos += _RECORD.size + length
        pending = chunk if kind in (_FULL, _FIRST) else pending + chunk
        if kind in (_FULL, _LAST):
            yield pending


def wandb_records(path: Path) -> Iterator:
    """The ``wandb_internal_pb2.Record``s of one ``run-*.wandb`` file, in write order."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    if len(data) < _HEADER.size or _HEADER.unpack_from(data)[:2] != (b":W&B", _MAGIC):
        raise UserError(f"{path} is not a wandb run file (no ':W&B' header)")
    for payload in _leveldb_payloads(data, str(path)):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        yield record


def _item_key(item) -> str:
    return item.key or ".".join(item.nested_key)


def wandb_run_files(run_dir: Path) -> list[Path]:
    """Every ``run-*.wandb`` of the run (online or offline), oldest first (the folder names hold the start time)."""
    files = Path(run_dir).glob("wandb/*run-*/run-*.wandb")
    return sorted(files, key=lambda f: f.parent.name.split("run-", 1)[1])


def _add(history: dict[str, dict[int, float]], key: str, step: int, value: object) -> None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        history.setdefault(key, {})[step] = float(value)


def read_wandb_history(files: list[Path]) -> dict[str, dict[int, float]]:
    history: dict[str, dict[int, float]] = {}
    for path in files:
        for record in wandb_records(path):
            if record.WhichOneof("record_type") != "history":
                continue
            # nested keys (more than one part) are the metadata of logged media such as tables: skipped
            row = {_item_key(i): json.loads(i.value_json) for i in record.history.item if len(i.nested_key) <= 1}
            step = int(row.get("trainer/global_step", row.get("_step", record.history.step.num)))
            for key, value in row.items():
                if key not in _WANDB_INTERNAL:
                    _add(history, key, step, value)
    return history


def read_csv_history(path: Path) -> dict[str, dict[int, float]]:
    history: dict[str, dict[int, float]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            step = int(float(row["step"]))
            for key, cell in row.items():
                if key not in ("step", "epoch") and cell not in ("", None):
                    _add(history, key, step, float(cell))
    return history


def load_history(run_dir: str | Path) -> dict[str, Series]:
    """Every scalar metric of a run: ``{name: [(rl_step, value), ...]}`` sorted by step, from the CSV
    log and the wandb files, whichever exist (both when both loggers ran)."""
    run_dir = Path(run_dir)
    csv_files = sorted(run_dir.glob("csv/**/metrics.csv"))
    wandb_files = wandb_run_files(run_dir)
    if not csv_files and not wandb_files:
        raise UserError(
            f"no metrics under {run_dir}: expected csv/metrics.csv (logger=csv) "
            "or wandb/*run-*/run-*.wandb (logger=wandb)"
        )
    merged: dict[str, dict[int, float]] = {}
    for part in [read_csv_history(f) for f in csv_files] + [read_wandb_history(wandb_files)]:
        for key, points in part.items():
            merged.setdefault(key, {}).update(points)
    return {key: sorted(points.items()) for key, points in sorted(merged.items())}


def load_run_config(run_dir: str | Path) -> dict:
    """The run's config: Hydra's ``.hydra/config.yaml``, else the config logged to wandb (WandbSetup)."""
    run_dir = Path(run_dir)
    saved = run_dir / ".hydra" / "config.yaml"
    if saved.is_file():
        return yaml.safe_load(saved.read_text()) or {}
    config: dict = {}
    for path in wandb_run_files(run_dir):
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            updates = record.run.config.update if kind == "run" else record.config.update if kind == "config" else []
            config.update({_item_key(u): json.loads(u.value_json) for u in updates if _item_key(u) != "_wandb"})
    if not config:
        raise UserError(f"no config for {run_dir}: expected .hydra/config.yaml (train.py writes it) or a wandb run")
    return config


@dataclass
class Run:
    """One run directory: who it is (env, algo, seed, from its config), its metric history, the label
    of the group it is plotted / tabled in (its algo unless given), and its saved config."""

    run_dir: Path
    env: str
    algo: str
    seed: int | None
    history: dict[str, Series]
    label: str
    config: dict = field(default_factory=dict)


RUN_ARGS_HELP = "run directories (hydra.run.dir of each run); LABEL=DIR groups a run under LABEL instead of its algo name"


def load_run(run_dir: str | Path, label: str | None = None) -> Run:
    config = load_run_config(run_dir)
    algo = (config.get("algo") or {}).get("name")
    if algo is None:
        raise UserError(f"{run_dir}: its config has no algo.name, so its algorithm is unknown")
    env = (config.get("env") or {}).get("name") or "?"
    return Run(Path(run_dir), str(env), str(algo), config.get("seed"), load_history(run_dir), label or str(algo),
               config)


def split_run_arg(arg: str) -> tuple[str | None, str]:
    """A command-line run's label (None without one) and directory: ``DIR`` or ``LABEL=DIR`` (a label has no ``/``)."""
    label, sep, path = arg.partition("=")
    return (label, path) if sep and label and "/" not in label else (None, arg)


def load_run_arg(arg: str) -> Run:
    """A command-line run: ``DIR`` or ``LABEL=DIR``."""
    label, path = split_run_arg(arg)
    return load_run(path, label)


def seed_std(values: list[float]) -> float:
    """The spread over seeds that summaries and plots show: the sample std (0 for a single seed)."""
    return statistics.stdev(values) if len(values) > 1 else 0.0


def group_runs(runs: list[Run]) -> dict[str, list[Run]]:
    """Runs grouped by label (the seeds of one setting; the algo unless given), as ``env/label`` when the
    runs span several environments; groups keep the order in which their first run was given."""
    several_envs = len({r.env for r in runs}) > 1
    groups: dict[str, list[Run]] = {}
    for r in runs:
        groups.setdefault(f"{r.env}/{r.label}" if several_envs else r.label, []).append(r)
    return groups
