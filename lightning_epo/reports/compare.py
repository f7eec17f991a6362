"""A paired comparison of arms of one experiment: arms x seeds, every arm of a seed starting from that seed's one warm
start, each run's final evaluation, and one report.

    python -m lightning_epo.reports.compare PLAN.yaml --out DIR [--python .venv/bin/python]

PLAN.yaml (written down, and committed, before the first run: DESIGN.md "Reproducibility and comparisons")::

    experiment: smollm2_gridworld            # the recipe every run runs, its warm start included
    seeds: [0, 1, 2, 3]
    common: [algo.grpo.norm_by_std=true]     # overrides of every run
    arms:                                    # name: its overrides; the first arm is the baseline
      no_entropy: [algo=grpo]
      epo: [algo=grpo_epo]

Runs: ``DIR/<arm>/s<seed>`` (``python train.py experiment=E seed=S COMMON ARM logger=wandb run_group=PLAN-ARM
run_name=ARM-sS hydra.run.dir=...``, one at a time; PLAN is the plan file's name): wandb (offline) shows each arm as
one group, its seeds averaged, the entropy panels of every arm side by side after ``wandb sync
DIR/*/s*/wandb/*run-*``. A seed's warm start runs once, in ``DIR/warm_start/s<seed>``, which each of the seed's runs
sees as its own ``warm_start/`` (a link: lightning_epo/runtime/warm_start.py reuses a policy found there). Arms that
would train different warm starts (an arm that overrides a key the stage inherits, or a prompt setting) are refused
at start. A run whose checkpoint records it finished is skipped; a stopped one resumes (``ckpt_path=last``). Run the
command again after a stop; ``--status`` prints where each run stands, with the finished runs' success, and runs
nothing.

The report (``DIR/report.md``, and the figures in ``DIR/figures``): per arm the final evaluation's success (the last
``val/<split>/success`` of each run), pooled over seeds with its 95 % Wilson interval; per seed each arm's paired
difference against the baseline; the mean paired difference over seeds with a 95 % interval from a two-level
bootstrap (seeds drawn with replacement, then each drawn run's episodes redrawn from its observed rate; the seed is
the unit of pairing, so this carries both the spread of training over seeds and the evaluation's sampling noise, and
with few seeds it is too narrow rather than too wide); the entropy of early and late turns and the share of mixed
groups per RL step, overlaid per arm (``reports.plot``); and every run's command.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from lightning_epo.core import layout
from lightning_epo.core.errors import UserError, exit_with_error
from lightning_epo.reports.plot import plot_runs
from lightning_epo.reports.run_history import load_run
from lightning_epo.reports.summary import Evaluation, score_run
from lightning_epo.reports.wilson import format_rate
from lightning_epo.runtime.warm_start import STAGE_DIR, compose_config, stage_overrides
from lightning_epo.training.checkpoint_io import finished_steps_in, rl_steps_in

REPO = Path(__file__).resolve().parents[2]
SPLITS = ("iid", "ood")
BOOTSTRAP_DRAWS = 10_000


@dataclass
class Plan:
    """PLAN.yaml: the experiment, the seeds, the overrides of every run and of each arm (the first: the baseline)."""

    name: str
    experiment: str
    seeds: list[int]
    common: list[str]
    arms: dict[str, list[str]]

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
        return cls(path.stem, str(data["experiment"]), [int(s) for s in data["seeds"]], list(data.get("common") or []),
                   {str(name): list(overrides or []) for name, overrides in data["arms"].items()})

    def overrides(self, arm: str, seed: int) -> list[str]:
        """A run's overrides (the run directory and a resume apart); wandb groups the runs by arm."""
        return [f"experiment={self.experiment}", f"seed={seed}", *self.common, *self.arms[arm], "logger=wandb",
                f"run_group={self.name}-{arm}", f"run_name={arm}-s{seed}"]


def run_dir(out: Path, arm: str, seed: int) -> Path:
    return out / arm / f"s{seed}"


def check_shared_warm_starts(plan: Plan, out: Path) -> None:
    """Every arm of a seed must train the same warm start (the stage's overrides, runtime/warm_start.py): one line
    naming the arms that would not."""
    for seed in plan.seeds:
        stages = {}
        for arm in plan.arms:
            cfg = compose_config([*plan.overrides(arm, seed), f"run_dir={run_dir(out, arm, seed)}"])
            if cfg.warm_start is None:
                raise UserError(f"experiment={plan.experiment} (arm {arm}) has no warm_start: the arms of a seed share "
                                "its warm start; pick an experiment with one")
            stages[arm] = stage_overrides(cfg, plan.overrides(arm, seed), out / STAGE_DIR / f"s{seed}")
        baseline = next(iter(plan.arms))
        differ = [arm for arm, stage in stages.items() if stage != stages[baseline]]
        if differ:
            raise UserError(f"arms {', '.join(differ)} would train another warm start than {baseline} (they override "
                            "a key the stage inherits, or a prompt setting): move that override to common")


def last_checkpoint(out: Path, arm: str, seed: int) -> Path:
    return run_dir(out, arm, seed) / layout.CHECKPOINTS / layout.LAST_CHECKPOINT


def finished(out: Path, arm: str, seed: int) -> bool:
    """Whether the run's checkpoint records that it finished."""
    last = last_checkpoint(out, arm, seed)
    return last.exists() and finished_steps_in(last) is not None


def command(plan: Plan, out: Path, arm: str, seed: int, python: str) -> list[str] | None:
    """The command that runs (or resumes) ``arm`` at ``seed``; None when the run has finished."""
    if finished(out, arm, seed):
        return None
    resume = ["ckpt_path=last"] if last_checkpoint(out, arm, seed).exists() else []
    directory = run_dir(out, arm, seed)
    return [python, str(REPO / "train.py"), *plan.overrides(arm, seed), *resume, f"hydra.run.dir={directory}"]


def link_warm_start(out: Path, arm: str, seed: int) -> None:
    """Make ``DIR/warm_start/s<seed>`` the run's ``warm_start/`` (the first run of the seed trains it there)."""
    shared = out / STAGE_DIR / f"s{seed}"
    shared.mkdir(parents=True, exist_ok=True)
    link = run_dir(out, arm, seed) / STAGE_DIR
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        link.symlink_to(os.path.relpath(shared, link.parent), target_is_directory=True)


def run_all(plan: Plan, out: Path, python: str) -> None:
    """Every run not finished, seed by seed (a stop leaves every arm with the same seeds), one at a time; the
    commands go to ``DIR/commands.txt``."""
    with open(out / "commands.txt", "a") as log:
        for seed in plan.seeds:
            for arm in plan.arms:
                argv = command(plan, out, arm, seed, python)
                if argv is None:
                    print(f"{arm} s{seed}: finished, skipped", flush=True)
                    continue
                link_warm_start(out, arm, seed)
                log.write(" ".join(argv) + "\n")
                log.flush()
                print(f"{arm} s{seed}: {' '.join(argv[1:])}", flush=True)
                with open(run_dir(out, arm, seed) / "compare.log", "a") as output:
                    code = subprocess.run(argv, cwd=REPO, stdout=output, stderr=subprocess.STDOUT).returncode
                if code != 0:
                    raise UserError(f"{arm} s{seed} exited {code} (its output: {run_dir(out, arm, seed)}/compare.log); "
                                    "run the comparison again to resume it")


def final_evaluation(directory: Path, split: str) -> Evaluation:
    """The last logged ``val/<split>/success`` of the run in ``directory`` with its episode count
    (:func:`~lightning_epo.reports.summary.score_run`)."""
    last = score_run(load_run(directory), f"val/{split}/success", window=1).last
    if last.episodes is None:
        raise UserError(f"{directory} logged no episode count for its final val/{split}/success: rerun its evaluation")
    return last


def _wins(evaluation: Evaluation) -> int:
    return round(evaluation.success * evaluation.episodes)


def paired_interval(arm: list[Evaluation], base: list[Evaluation], seed: int = 0) -> tuple[float, float, float]:
    """The mean over seeds of ``arm[s].success - base[s].success`` and its 95 % two-level bootstrap interval (module
    docstring): seeds drawn with replacement, then each drawn run's episodes redrawn, ``Binomial(n, p) / n``."""
    rng = np.random.default_rng(seed)
    a_rate, a_n = np.array([f.success for f in arm]), np.array([f.episodes for f in arm])
    b_rate, b_n = np.array([f.success for f in base]), np.array([f.episodes for f in base])
    picks = rng.integers(0, len(arm), size=(BOOTSTRAP_DRAWS, len(arm)))
    drawn = rng.binomial(a_n[picks], a_rate[picks]) / a_n[picks] - rng.binomial(b_n[picks], b_rate[picks]) / b_n[picks]
    low, high = np.percentile(drawn.mean(axis=1), [2.5, 97.5])
    return float(np.mean(a_rate - b_rate)), float(low), float(high)


def run_state(out: Path, arm: str, seed: int) -> str:
    """``finished``, ``stopped after RL step K`` (a checkpoint to resume from) or ``not started``."""
    if not last_checkpoint(out, arm, seed).exists():
        return "not started"
    if finished(out, arm, seed):
        return "finished"
    return f"stopped after RL step {rl_steps_in(last_checkpoint(out, arm, seed))}"


def status(plan: Plan, out: Path) -> str:
    """Where each run of the comparison stands, seed by seed, with the final success of the finished ones (95 %
    Wilson interval): what a comparison spread over several sessions has so far. Runs nothing."""
    lines = ["| seed | arm | state | " + " | ".join(f"{s.upper()} success" for s in SPLITS) + " |",
             "|---|---|---|" + "---|" * len(SPLITS)]
    for seed in plan.seeds:
        for arm in plan.arms:
            state = run_state(out, arm, seed)
            cells = ["-"] * len(SPLITS)
            if state == "finished":
                finals = [final_evaluation(run_dir(out, arm, seed), split) for split in SPLITS]
                cells = [format_rate(_wins(f), f.episodes) for f in finals]
            lines.append(f"| {seed} | {arm} | {state} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def report(plan: Plan, out: Path) -> str:
    """The report's markdown (module docstring); draws the figures into ``DIR/figures``."""
    arms, baseline = list(plan.arms), next(iter(plan.arms))
    finals = {(arm, seed, split): final_evaluation(run_dir(out, arm, seed), split)
              for arm in arms for seed in plan.seeds for split in SPLITS}
    lines = [f"# Comparison: experiment={plan.experiment}, seeds {plan.seeds}", "",
             f"Baseline: {baseline}. Common overrides: {' '.join(plan.common) or 'none'}.", "",
             "## Final success per arm (pooled over seeds, 95 % Wilson interval)", "",
             "| arm | overrides | " + " | ".join(f"{s.upper()} success" for s in SPLITS) + " |",
             "|---|---|" + "---|" * len(SPLITS)]
    for arm in arms:
        cells = []
        for split in SPLITS:
            runs = [finals[arm, seed, split] for seed in plan.seeds]
            cells.append(format_rate(sum(_wins(f) for f in runs), sum(f.episodes for f in runs)))
        lines.append(f"| {arm} | {' '.join(plan.arms[arm]) or '-'} | " + " | ".join(cells) + " |")
    for split in SPLITS:
        lines += ["", f"## {split.upper()}: paired differences against {baseline}", "",
                  "| arm | " + " | ".join(f"s{seed}" for seed in plan.seeds) + " | mean [95 % interval] |",
                  "|---|" + "---|" * (len(plan.seeds) + 1)]
        base = [finals[baseline, seed, split] for seed in plan.seeds]
        for arm in arms[1:]:
            runs = [finals[arm, seed, split] for seed in plan.seeds]
            mean, low, high = paired_interval(runs, base)
            per_seed = " | ".join(f"{a.success - b.success:+.3f}" for a, b in zip(runs, base))
            lines.append(f"| {arm} | {per_seed} | {mean:+.3f} [{low:+.3f}, {high:+.3f}] |")
    labelled = [f"{arm}={run_dir(out, arm, seed)}" for arm in arms for seed in plan.seeds]
    figures = plot_runs(labelled, out / "figures")
    lines += ["", "## Figures (mean and ±1 std over seeds, per arm)", ""]
    lines += [f"- [{path.name}]({path.relative_to(out)})" for path in figures]
    lines += ["", f"In wandb (offline; groups {plan.name}-<arm>): `wandb sync {out}/*/s*/wandb/*run-*`"]
    commands = out / "commands.txt"
    lines += ["", "## Commands", "", "```", *(commands.read_text().splitlines() if commands.exists() else []), "```"]
    return "\n".join(lines) + "\n"


def compare(plan_path: Path, out: Path, python: str = sys.executable) -> Path:
    """Run what is missing of the comparison in ``plan_path`` and write its report; returns the report's path."""
    plan = Plan.read(plan_path)
    out.mkdir(parents=True, exist_ok=True)
    check_shared_warm_starts(plan, out)
    run_all(plan, out, python)
    path = out / "report.md"
    path.write_text(report(plan, out))
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lightning_epo.reports.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("plan", type=Path, help="PLAN.yaml: experiment, seeds, common overrides, arms")
    parser.add_argument("--out", type=Path, required=True, help="the comparison's folder (runs, report, figures)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter of the runs")
    parser.add_argument("--status", action="store_true",
                        help="print where each run stands (and the finished ones' success), run nothing")
    args = parser.parse_args(argv)
    try:
        if args.status:
            print(status(Plan.read(args.plan), args.out), end="")
            return
        print(f"wrote {compare(args.plan, args.out, args.python)}")
    except UserError as exc:
        exit_with_error(exc)


if __name__ == "__main__":
    main()
