"""A comparison's finished seeds kept where a fresh checkout finds them (``--keep DIR``, a folder committed with the
repository, e.g. ``docs/records/<PLAN>``): for a comparison spread over sessions whose ``--out`` does not survive.

A seed is kept once every run of it has finished (its arms and its control): per run the files the report reads and none
of the checkpoints (``.hydra/``'s config and overrides, ``eval.json``, ``eval_episodes.jsonl``, ``turn_entropy.jsonl``,
``machines.jsonl``, the metric history as ``csv/metrics.csv`` whichever logger wrote it), the seed's warm start's
config, machine and history (for the record: nothing reads them back), and the seed's lines of ``timings.tsv`` and
``commands.txt``. At the next start the kept runs missing from ``--out`` are copied back into it, each marked ``kept``
(finished: :func:`~lightning_epo.reports.comparison.plan.finished`), so they are skipped, not rerun, and the report
reads them as it reads the runs it ran itself. Plans may share one folder: a plan that adds an arm to seeds another plan
kept gets those seeds' kept runs back (only its new arm runs) and, once the new arm has finished, adds it alone; the
warm start's record stays the one first kept. Where the new arm's checkout trained the seed's warm start again (its
policy is not kept), the seed is kept only if that warm start is the same, its SFT losses the kept ones
(:func:`check_kept_runs_share_the_warm_start`).
"""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

from lightning_epo.core import layout
from lightning_epo.core.errors import UserError
from lightning_epo.reports.comparison.plan import COMMANDS, KEPT, TIMINGS, Plan, finished, run_dir
from lightning_epo.reports.run_history import load_history
from lightning_epo.runtime.warm_start import STAGE_DIR

SFT_LOSS = "loss/policy"  # a warm start's loss at each SFT step: the same training logs the same values
RECORDS = (".hydra/config.yaml", ".hydra/overrides.yaml", layout.EVAL, layout.EVAL_EPISODES, layout.TURN_ENTROPY,
           layout.MACHINES)


def keep_finished(plan: Plan, out: Path, keep: Path) -> list[int]:
    """Copy the runs ``keep`` lacks of every seed of ``plan`` whose runs have all finished in ``out`` into ``keep``
    (and the seed's warm start, where ``keep`` has none); returns the seeds copied. A seed whose runs copied back
    from ``keep`` would be kept beside runs from another warm start is refused
    (:func:`check_kept_runs_share_the_warm_start`)."""
    kept = []
    for seed in plan.seeds:
        missing = [arm for arm in plan.compared if not (keep / arm / f"s{seed}").exists()]
        if not missing or not all(finished(plan, out, arm, seed) for arm in plan.compared):
            continue
        check_kept_runs_share_the_warm_start(plan, out, keep, seed)
        for arm in missing:
            _copy_run(run_dir(out, arm, seed), keep / arm / f"s{seed}", history=arm != plan.control)
        stage = run_dir(out, STAGE_DIR, seed)  # DIR/warm_start/s<seed>: the seed's warm start
        if stage.is_dir() and not run_dir(keep, STAGE_DIR, seed).exists():
            _copy_run(stage, run_dir(keep, STAGE_DIR, seed), history=True)
        _append_lines(out, keep, plan, seed)
        kept.append(seed)
    return kept


def restore_kept(plan: Plan, out: Path, keep: Path) -> list[int]:
    """Copy the kept runs of every seed of ``plan`` that ``out`` lacks entirely back into ``out``, each run marked
    ``kept`` (a seed's arms not in ``keep`` stay to be run); returns the seeds restored. A seed already (partly) in
    ``out`` is left alone."""
    restored = []
    for seed in plan.seeds:
        if any(run_dir(out, arm, seed).exists() for arm in plan.compared):
            continue
        kept = {arm: keep / arm / f"s{seed}" for arm in plan.compared if (keep / arm / f"s{seed}").is_dir()}
        if not kept:
            continue
        for arm, source in kept.items():
            shutil.copytree(source, run_dir(out, arm, seed))
            (run_dir(out, arm, seed) / KEPT).write_text(f"restored from {source}\n")
        _append_lines(keep, out, plan, seed)
        restored.append(seed)
    return restored


def check_kept_runs_share_the_warm_start(plan: Plan, out: Path, keep: Path, seed: int) -> None:
    """The seed's runs copied back from ``keep`` started from the warm start kept with them; where this checkout
    trained the seed's warm start again (records keep no weights), the runs made here pair with them only if it is the
    same one: its SFT loss (``loss/policy``) equal to the kept history's, within 1e-6 relative, at each step both
    logged. One line naming the kept runs where it is not, before the seed is kept (its records would pair runs of two
    warm starts)."""
    restored = [arm for arm in plan.compared if (run_dir(out, arm, seed) / KEPT).is_file()]
    differs = _sft_losses_differ(run_dir(out, STAGE_DIR, seed), run_dir(keep, STAGE_DIR, seed)) if restored else None
    if differs:
        raise UserError(f"seed {seed}: its warm start, trained again in {out}, is not the one its kept runs started "
                        f"from ({differs}): {', '.join(restored)} do not pair with the runs made here; run this seed "
                        f"in another --out and --keep, where all its runs start from one warm start (move "
                        f"{run_dir(out, STAGE_DIR, seed)} there to reuse it)")


def _sft_losses_differ(here: Path, kept: Path, rel_tol: float = 1e-6) -> str | None:
    """The first step both warm starts logged at which their ``loss/policy`` differ (``"loss/policy at step k: a here,
    b kept"``); None where they agree at every such step (a warm start stopped part way agrees so far), or either has
    no such history (nothing to compare)."""
    try:
        ours, theirs = (dict(load_history(run).get(SFT_LOSS, [])) for run in (here, kept))
    except UserError:  # a run without metrics
        return None
    for step in sorted(ours.keys() & theirs.keys()):
        if abs(ours[step] - theirs[step]) > rel_tol * abs(theirs[step]):
            return f"{SFT_LOSS} at step {step}: {ours[step]!r} here, {theirs[step]!r} kept"
    return None


def _copy_run(source: Path, target: Path, history: bool) -> None:
    """The record files of the run directory ``source`` (and its metric history as a csv) into ``target``."""
    for name in RECORDS:
        if (source / name).is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / name, target / name)
    if history:
        write_history_csv(load_history(source), target / layout.CSV_METRICS)
    target.mkdir(parents=True, exist_ok=True)


def write_history_csv(history: dict[str, list[tuple[int, float]]], path: Path) -> None:
    """``{metric: [(rl_step, value)]}`` as Lightning's CSVLogger writes it (a ``step`` column, one row a step), which
    :func:`~lightning_epo.reports.run_history.load_history` reads back value for value (``repr`` of each float)."""
    steps = sorted({step for series in history.values() for step, _ in series})
    table = {step: {} for step in steps}
    for name, series in history.items():
        for step, value in series:
            table[step][name] = repr(value)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=["step", *sorted(history)])
        writer.writeheader()
        writer.writerows({"step": step, **table[step]} for step in steps)


def _append_lines(source: Path, target: Path, plan: Plan, seed: int) -> None:
    """The seed's lines of ``source``'s timings and commands appended to ``target``'s (those it lacks)."""
    runs = {(arm, f"s{seed}") for arm in plan.compared}

    def of_seed(name: str, line: str) -> bool:
        if name == TIMINGS:  # arm, seed, start, wall seconds, exit code
            arm, line_seed = line.split("\t")[:2]
            return (arm, f"s{line_seed}") in runs
        return any(word.startswith("hydra.run.dir=") and Path(word.split("=", 1)[1]).parts[-2:] in runs
                   for word in line.split())

    for name in (TIMINGS, COMMANDS):
        lines = (source / name).read_text().splitlines() if (source / name).is_file() else []
        present = set((target / name).read_text().splitlines()) if (target / name).is_file() else set()
        new = [line for line in lines if of_seed(name, line) and line not in present]
        if new:
            target.mkdir(parents=True, exist_ok=True)
            with open(target / name, "a") as file:
                file.write("".join(line + "\n" for line in new))
