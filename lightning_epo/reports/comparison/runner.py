"""Running a plan's runs one at a time, seed by seed, each seed's warm start shared by its arms (a link) and evaluated
by its control after them, stopped runs resumed, finished ones skipped."""

from __future__ import annotations

import os
import subprocess
import time
from collections import defaultdict
from datetime import datetime
from functools import partial
from pathlib import Path

from omegaconf import DictConfig

from lightning_epo.core.errors import UserError
from lightning_epo.reports.comparison.plan import COMMANDS, LOG, TIMINGS, Plan, finished, last_checkpoint, run_dir
from lightning_epo.runtime.machine_record import recorded_precisions
from lightning_epo.runtime.warm_start import STAGE_DIR, compose_config, stage_overrides

REPO = Path(__file__).resolve().parents[3]


def run_config(plan: Plan, out: Path, arm: str, seed: int) -> DictConfig:
    """The config ``arm``'s run at ``seed`` composes (resolved on this machine where read)."""
    return compose_config([*plan.overrides(arm, seed, out), f"run_dir={run_dir(out, arm, seed)}"])


def warm_start_overrides(plan: Plan, out: Path, arm: str, seed: int, cfg: DictConfig) -> list[str]:
    """The overrides of the warm start that ``arm``'s run (config ``cfg``) at ``seed`` trains or reuses."""
    return stage_overrides(cfg, plan.overrides(arm, seed, out), out / STAGE_DIR / f"s{seed}")


def warm_start_config(plan: Plan, out: Path, arm: str, seed: int) -> DictConfig:
    """The config of the warm start that ``arm``'s run at ``seed`` trains or reuses."""
    return compose_config(warm_start_overrides(plan, out, arm, seed, run_config(plan, out, arm, seed)))


def check_shared_warm_starts(plan: Plan, out: Path) -> None:
    """Every arm of a seed must train the same warm start (the stage's overrides, runtime/warm_start.py): one line
    naming the arms that would not."""
    for seed in plan.seeds:
        stages = {}
        for arm in plan.arms:
            cfg = run_config(plan, out, arm, seed)
            if cfg.warm_start is None:
                raise UserError(f"experiment={plan.experiment} (arm {arm}) has no warm_start: the arms of a seed share "
                                "its warm start; pick an experiment with one")
            stages[arm] = warm_start_overrides(plan, out, arm, seed, cfg)
        baseline = next(iter(plan.arms))
        differ = [arm for arm, stage in stages.items() if stage != stages[baseline]]
        if differ:
            raise UserError(f"arms {', '.join(differ)} would train another warm start than {baseline} (they override "
                            "a key the stage inherits, or a prompt setting): move that override to common")


def check_one_precision(plan: Plan, out: Path) -> None:
    """A seed with runs still to run runs where its runs ran: each of its runs (its warm start included) that recorded
    its precision (``machines.jsonl``, runtime/machine_record.py) recorded the one its command resolves to on this
    machine. The recipes pick bf16 or float32 by the CPU, so a seed continued on another kind of CPU would pair runs
    of two precisions: one line naming them, before anything runs."""
    baseline = next(iter(plan.arms))
    for seed in plan.seeds:
        if all(finished(plan, out, arm, seed) for arm in plan.compared):
            continue
        configs = {arm: partial(run_config, plan, out, arm, seed) for arm in plan.compared}
        configs[STAGE_DIR] = partial(warm_start_config, plan, out, baseline, seed)
        moved = defaultdict(list)  # (precision recorded, precision resolved here): the runs
        for name, config in configs.items():
            recorded = recorded_precisions(run_dir(out, name, seed))
            here = str(config().trainer.precision) if recorded else None
            for precision in recorded:
                if precision != here:
                    moved[precision, here].append(name)
        if moved:
            mixed = "; ".join(f"{', '.join(names[:-1]) + ' and ' if len(names) > 1 else ''}{names[-1]} ran in {ran} "
                              f"where this machine resolves {'their commands' if len(names) > 1 else 'its command'} "
                              f"to {here}" for (ran, here), names in moved.items())
            raise UserError(f"seed {seed}: {mixed}: a seed's runs pair only in one precision; run it on a CPU like "
                            "theirs (python -m lightning_epo.doctor says whether this one computes bf16 natively), or "
                            "in another --out and --keep")


def command(plan: Plan, out: Path, arm: str, seed: int, python: str) -> list[str] | None:
    """The command that runs (or resumes) ``arm`` at ``seed``; None when the run has finished. The control's
    evaluation starts again after a stop (it has no checkpoint; its episode records keep the last of each place)."""
    if finished(plan, out, arm, seed):
        return None
    resume = ["ckpt_path=last"] if arm != plan.control and last_checkpoint(out, arm, seed).exists() else []
    directory = run_dir(out, arm, seed)
    return [python, str(REPO / "train.py"), *plan.overrides(arm, seed, out), *resume, f"hydra.run.dir={directory}"]


def link_warm_start(out: Path, arm: str, seed: int) -> None:
    """Make ``DIR/warm_start/s<seed>`` the run's ``warm_start/`` (the first run of the seed trains it there)."""
    shared = out / STAGE_DIR / f"s{seed}"
    shared.mkdir(parents=True, exist_ok=True)
    link = run_dir(out, arm, seed) / STAGE_DIR
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        link.symlink_to(os.path.relpath(shared, link.parent), target_is_directory=True)


def run_all(plan: Plan, out: Path, python: str) -> None:
    """Every run not finished, seed by seed (a stop leaves every arm with the same seeds), one at a time, a seed's
    control after its arms (the first of which trains the warm start it evaluates); the commands go to
    ``DIR/commands.txt``, each one's start, wall seconds and exit code to ``DIR/timings.tsv``."""
    with open(out / COMMANDS, "a") as log:
        for seed in plan.seeds:
            for arm in [*plan.arms, *([plan.control] if plan.control else [])]:
                argv = command(plan, out, arm, seed, python)
                if argv is None:
                    print(f"{arm} s{seed}: finished, skipped", flush=True)
                    continue
                if arm == plan.control:
                    run_dir(out, arm, seed).mkdir(parents=True, exist_ok=True)
                else:
                    link_warm_start(out, arm, seed)
                log.write(" ".join(argv) + "\n")
                log.flush()
                print(f"{arm} s{seed}: {' '.join(argv[1:])}", flush=True)
                started, clock = datetime.now().isoformat(timespec="seconds"), time.monotonic()
                with open(run_dir(out, arm, seed) / LOG, "a") as output:
                    code = subprocess.run(argv, cwd=REPO, stdout=output, stderr=subprocess.STDOUT).returncode
                with open(out / TIMINGS, "a") as timings:
                    timings.write(f"{arm}\t{seed}\t{started}\t{time.monotonic() - clock:.1f}\t{code}\n")
                if code != 0:
                    raise UserError(f"{arm} s{seed} exited {code} (its output: {run_dir(out, arm, seed)}/{LOG}); "
                                    "run the comparison again to resume it")
