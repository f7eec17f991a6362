"""PLAN.yaml and where each of its runs lives: ``DIR/<arm>/s<seed>``, its checkpoint, whether it finished."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from lightning_epo.core import layout
from lightning_epo.core.errors import UserError
from lightning_epo.reports.eval_episodes import final_outcomes
from lightning_epo.runtime.warm_start import STAGE_DIR
from lightning_epo.training.checkpoint_io import finished_steps_in

LOG = "compare.log"  # DIR/<arm>/s<seed>/compare.log: the output of the run's commands
SPLITS = ("iid", "ood")  # the evaluation splits a comparison reports
TIMINGS = "timings.tsv"  # DIR/timings.tsv: arm, seed, start, wall seconds, exit code of each command run
COMMANDS = "commands.txt"  # DIR/commands.txt: every command run, one a line
KEPT = "kept"  # DIR/<arm>/s<seed>/kept: a finished run copied back from --keep's records (no checkpoint)


@dataclass
class Plan:
    """PLAN.yaml: the experiment, the seeds, the overrides of every run and of each arm (the first: the baseline)."""

    name: str
    experiment: str
    seeds: list[int]
    common: list[str]
    arms: dict[str, list[str]]
    contrasts: list[tuple[str, str]]  # pairs of arms compared with each other as well as with the baseline
    control: str | None = None  # an arm that trains nothing: each seed's warm start evaluated (then the baseline)

    @classmethod
    def read(cls, path: Path) -> Plan:
        data = yaml.safe_load(path.read_text()) or {}
        missing = [key for key in ("experiment", "seeds", "arms") if key not in data]
        control = None if data.get("control") is None else str(data["control"])
        if missing or len(data.get("arms") or {}) + (control is not None) < 2:
            raise UserError(f"{path}: a plan needs experiment, seeds and at least two arms (missing: "
                            f"{', '.join(missing) or 'a second arm'}); see python -m lightning_epo.reports.compare -h")
        named = [path.stem, *map(str, data["arms"]), *([control] if control else [])]
        if control in map(str, data["arms"]):
            raise UserError(f"{path}: the control {control} is also an arm: give it another name")
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
                   [(arm, other) for arm, other in pairs], control)

    def with_seeds(self, seeds: list[int]) -> Plan:
        """The plan limited to ``seeds`` (``--seeds``: a pre-registered pause after the first seeds, e.g. a rule read
        on seed 0 before the others run); a seed the plan lacks is refused."""
        unknown = sorted(set(seeds) - set(self.seeds))
        if unknown:
            raise UserError(f"--seeds {' '.join(map(str, unknown))}: not a seed of the plan {self.name} "
                            f"(its seeds: {' '.join(map(str, self.seeds))})")
        return replace(self, seeds=[seed for seed in self.seeds if seed in seeds])

    @property
    def compared(self) -> list[str]:
        """The arms of the report, the baseline first: the control where the plan has one, then ``arms``."""
        return [self.control, *self.arms] if self.control else list(self.arms)

    def overrides(self, arm: str, seed: int, out: Path) -> list[str]:
        """A run's overrides (the run directory and a resume apart); wandb groups the runs by arm. The control's
        evaluate the seed's warm-start policy (``DIR/warm_start/s<seed>/policy``) as the arms' final evaluations
        evaluate theirs: the same common overrides, no training (docs/real_model.md's control command)."""
        own = (["mode=eval", "warm_start=null", f"model.name_or_path={out / STAGE_DIR / f's{seed}' / 'policy'}"]
               if arm == self.control else self.arms[arm])
        return [f"experiment={self.experiment}", f"seed={seed}", *self.common, *own, "logger=wandb",
                f"run_group={self.name}-{arm}", f"run_name={arm}-s{seed}"]


def run_dir(out: Path, arm: str, seed: int) -> Path:
    return out / arm / f"s{seed}"


def last_checkpoint(out: Path, arm: str, seed: int) -> Path:
    return run_dir(out, arm, seed) / layout.CHECKPOINTS / layout.LAST_CHECKPOINT


def finished(plan: Plan, out: Path, arm: str, seed: int) -> bool:
    """Whether the run finished: its checkpoint records it, or for the control, its evaluation wrote ``eval.json``
    and recorded every split's episodes (``eval_episodes.jsonl``); or it was copied back from kept records
    (:mod:`~lightning_epo.reports.comparison.records`)."""
    if (run_dir(out, arm, seed) / KEPT).is_file():
        return True
    if arm == plan.control:
        directory = run_dir(out, arm, seed)
        return (directory / layout.EVAL).is_file() and all(
            final_outcomes(directory, split, mode="eval") is not None for split in SPLITS)
    last = last_checkpoint(out, arm, seed)
    return last.exists() and finished_steps_in(last) is not None
