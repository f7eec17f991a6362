"""PLAN.yaml and where each of its runs lives: ``DIR/<arm>/s<seed>``, its checkpoint, whether it finished."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from lightning_epo.core import layout
from lightning_epo.core.errors import UserError
from lightning_epo.training.checkpoint_io import finished_steps_in

LOG = "compare.log"  # DIR/<arm>/s<seed>/compare.log: the output of the run's commands
TIMINGS = "timings.tsv"  # DIR/timings.tsv: arm, seed, start, wall seconds, exit code of each command run


@dataclass
class Plan:
    """PLAN.yaml: the experiment, the seeds, the overrides of every run and of each arm (the first: the baseline)."""

    name: str
    experiment: str
    seeds: list[int]
    common: list[str]
    arms: dict[str, list[str]]
    contrasts: list[tuple[str, str]]  # pairs of arms compared with each other as well as with the baseline

    @classmethod
    def read(cls, path: Path) -> Plan:
        data = yaml.safe_load(path.read_text()) or {}
        missing = [key for key in ("experiment", "seeds", "arms") if key not in data]
        if missing or len(data.get("arms") or {}) < 2:
            raise UserError(f"{path}: a plan needs experiment, seeds and at least two arms (missing: "
                            f"{', '.join(missing) or 'a second arm'}); see python -m lightning_epo.reports.compare -h")
        named = [path.stem, *map(str, data["arms"])]
        if not all(re.fullmatch(r"[\w.-]+", name) for name in named):
            raise UserError(f"{path}: the plan's file name and its arm names become run names and folders: use "
                            f"letters, digits, '_', '-' and '.' only (got {', '.join(named)})")
        pairs = [[str(arm) for arm in pair] for pair in data.get("contrasts") or []]
        unknown = [pair for pair in pairs if len(pair) != 2 or not set(pair) <= set(map(str, data["arms"]))]
        if unknown:
            arms = ", ".join(map(str, data["arms"]))
            raise UserError(f"{path}: each contrast is a pair of the plan's arms ({arms}); got {unknown}")
        return cls(path.stem, str(data["experiment"]), [int(s) for s in data["seeds"]], list(data.get("common") or []),
                   {str(name): list(overrides or []) for name, overrides in data["arms"].items()},
                   [(arm, other) for arm, other in pairs])

    def overrides(self, arm: str, seed: int) -> list[str]:
        """A run's overrides (the run directory and a resume apart); wandb groups the runs by arm."""
        return [f"experiment={self.experiment}", f"seed={seed}", *self.common, *self.arms[arm], "logger=wandb",
                f"run_group={self.name}-{arm}", f"run_name={arm}-s{seed}"]


def run_dir(out: Path, arm: str, seed: int) -> Path:
    return out / arm / f"s{seed}"


def last_checkpoint(out: Path, arm: str, seed: int) -> Path:
    return run_dir(out, arm, seed) / layout.CHECKPOINTS / layout.LAST_CHECKPOINT


def finished(out: Path, arm: str, seed: int) -> bool:
    """Whether the run's checkpoint records that it finished."""
    last = last_checkpoint(out, arm, seed)
    return last.exists() and finished_steps_in(last) is not None
