"""What a comparison found: each run's state and final success (``--status``), and the paired report (module
docstring of :mod:`lightning_epo.reports.compare`)."""

from __future__ import annotations

import json
from pathlib import Path

from lightning_epo.core import layout
from lightning_epo.core.errors import UserError
from lightning_epo.reports.comparison.plan import (COMMANDS, LOG, SPLITS, TIMINGS, Plan, finished, last_checkpoint,
                                                   run_dir)
from lightning_epo.reports.comparison.run_measures import difference_lines, measure_lines
from lightning_epo.reports.eval_episodes import final_episodes, final_outcomes, pair_outcomes, unwon_share
from lightning_epo.reports.paired import (POWER, Contrast, contrast_from_pairs, contrast_from_rates, format_interval,
                                          seed_cells)
from lightning_epo.reports.plot import mean_band, plot_loaded_runs
from lightning_epo.reports.run_history import Run, load_run
from lightning_epo.reports.summary import Evaluation, score_run
from lightning_epo.reports.wilson import format_rate
from lightning_epo.training.checkpoint_io import rl_steps_in

PER_STEP = {"entropy/early_turns": "Early-turn entropy (nat)", "entropy/late_turns": "Late-turn entropy (nat)",
            "train/mixed_groups": "Share of groups with mixed outcomes", "train/success": "Training success"}
FINISHED = "finished"
FAST = 2  # turns: an episode failed within them failed fast (docs/comparison_sciworld.md)


def wall_seconds(out: Path) -> dict[tuple[str, int], float]:
    """Each run's wall time, summed over the commands that ran it (a stopped run and its resumes; the first run of a
    seed includes the seed's warm start), from ``DIR/timings.tsv``."""
    spent: dict[tuple[str, int], float] = {}
    path = out / TIMINGS
    for line in path.read_text().splitlines() if path.exists() else []:
        arm, seed, _, seconds, _ = line.split("\t")
        spent[arm, int(seed)] = spent.get((arm, int(seed)), 0.0) + float(seconds)
    return spent


def final_success(run: Run, split: str) -> Evaluation:
    """The run's last logged ``val/<split>/success`` with its episode count
    (:func:`~lightning_epo.reports.summary.score_run`)."""
    last = score_run(run, f"val/{split}/success", window=1).last
    if last.episodes is None:
        raise UserError(f"{run.run_dir} logged no episode count for its final val/{split}/success: rerun its "
                        "evaluation")
    return last


def evaluated_success(directory: Path, split: str) -> Evaluation:
    """A ``mode=eval`` run's (the control's) ``val/<split>/success`` and episode count, from its ``eval.json``."""
    metrics = json.loads((directory / layout.EVAL).read_text())
    return Evaluation(metrics[f"val/{split}/success"], int(metrics[f"val/{split}/episodes"]))


def final_successes(plan: Plan, out: Path, arm: str, seed: int, run: Run | None = None) -> list[Evaluation]:
    """The run's final success of each split: the control's evaluation, else the last of the run's training (from
    ``run``, the run already loaded, where given)."""
    directory = run_dir(out, arm, seed)
    if arm == plan.control:
        return [evaluated_success(directory, split) for split in SPLITS]
    run = run or load_run(directory)
    return [final_success(run, split) for split in SPLITS]


def final_score(plan: Plan, out: Path, arm: str, seed: int, split: str, run: Run | None) -> float | None:
    """The run's final ``val/<split>/score`` (the environment's own, where it scores its episodes: ScienceWorld's):
    the control's from its ``eval.json``, else the last of ``run``'s (loaded); None where the run logged none."""
    name = f"val/{split}/score"
    if arm == plan.control:
        return json.loads((run_dir(out, arm, seed) / layout.EVAL).read_text()).get(name)
    series = run.history.get(name)
    return series[-1][1] if series else None


def run_mode(plan: Plan, arm: str) -> str:
    """The ``mode`` the arm's runs recorded their final evaluation in: ``eval`` for the control (a ``mode=eval`` run
    of the warm start), ``train`` for an arm that trains."""
    return "eval" if arm == plan.control else "train"


def failure_lines(plan: Plan, out: Path, pairs: list[tuple[str, str]]) -> list[str]:
    """Per split where any run's final evaluation had an episode that ended by a failure (neither won nor cut at the
    turn limit), that share, the share that failed within ``FAST`` turns and the share cut at the turn limit without
    a win, per arm and seed with the paired differences (:func:`difference_lines`); one line for a split where every
    run recorded its episodes and none failed."""
    lines = []
    for split in SPLITS:
        episodes = {(arm, seed): final_episodes(run_dir(out, arm, seed), split, run_mode(plan, arm))
                    for arm in plan.compared for seed in plan.seeds}
        recorded = [found for found in episodes.values() if found is not None]
        if len(recorded) == len(episodes) and not any(unwon_share(found, cut=False) for found in recorded):
            lines += ["", f"{split.upper()}: none of the final evaluation's {sum(map(len, recorded))} recorded "
                          f"episodes ({len(plan.compared)} arms x {len(plan.seeds)} seeds) ended by a failure: each "
                          "was won or cut at the turn limit."]
            continue
        for cut, within, what in ((False, None, "ended by a failure (neither won nor cut at the turn limit), share"),
                                  (False, FAST, f"ended by a failure within {FAST} turns, share"),
                                  (True, None, "cut at the turn limit without a win, share")):
            values = {arm: [None if episodes[arm, seed] is None else unwon_share(episodes[arm, seed], cut, within)
                            for seed in plan.seeds] for arm in plan.compared}
            if any(v for row in values.values() for v in row):
                lines += difference_lines(f"{split.upper()}: final evaluation's episodes {what}", values, plan.seeds,
                                          pairs)
    return lines


def _wins(evaluation: Evaluation) -> int:
    return round(evaluation.success * evaluation.episodes)


def contrast(out: Path, plan: Plan, arm: str, other: str, split: str,
             finals: dict[tuple[str, int, str], Evaluation]) -> Contrast:
    """``arm - other`` over the plan's seeds (:mod:`lightning_epo.reports.paired`): paired per task where every run of
    both arms recorded its final evaluation's episodes (``eval_episodes.jsonl``), else from the runs' rates."""
    modes = {name: run_mode(plan, name) for name in (arm, other)}
    recorded = {(name, seed): final_outcomes(run_dir(out, name, seed), split, modes[name])
                for name in (arm, other) for seed in plan.seeds}
    if any(outcomes is None for outcomes in recorded.values()):
        return contrast_from_rates(*([(_wins(finals[name, seed, split]), finals[name, seed, split].episodes)
                                      for seed in plan.seeds] for name in (arm, other)))
    for (name, seed), outcomes in recorded.items():
        won = sum(w for _, w in outcomes.values()) / len(outcomes)
        if abs(won - finals[name, seed, split].success) > 1e-6:
            raise UserError(f"{run_dir(out, name, seed)}: the last {split} evaluation of its eval_episodes.jsonl "
                            f"({won:.4f}) is not its last logged val/{split}/success "
                            f"({finals[name, seed, split].success:.4f})")
    return contrast_from_pairs([pair_outcomes(recorded[arm, seed], recorded[other, seed],
                                              f"{arm} - {other}, seed {seed}, {split}") for seed in plan.seeds])


def run_state(plan: Plan, out: Path, arm: str, seed: int) -> str:
    """``finished``, ``RL step K checkpointed`` (running, or stopped and resumable), ``started, no RL step
    checkpointed`` (its warm start or first step running, or stopped there; the control: its evaluation) or ``not
    started``."""
    if finished(plan, out, arm, seed):
        return FINISHED
    last = last_checkpoint(out, arm, seed)
    if last.exists():
        steps = rl_steps_in(last)  # None: a DeepSpeed checkpoint directory
        return f"RL step {steps} checkpointed" if steps is not None else "checkpointed"
    if (run_dir(out, arm, seed) / LOG).exists():
        return "started, no RL step checkpointed"
    return "not started"


def minutes(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 60:.1f} min"


def status(plan: Plan, out: Path) -> str:
    """Where each run of the comparison stands, seed by seed, with the final success of the finished ones (95 %
    Wilson interval): what a comparison spread over several sessions has so far. Runs nothing."""
    spent = wall_seconds(out)
    lines = ["| seed | arm | state | wall time | " + " | ".join(f"{s.upper()} success" for s in SPLITS) + " |",
             "|---|---|---|---|" + "---|" * len(SPLITS)]
    for seed in plan.seeds:
        for arm in plan.compared:
            cells = [run_state(plan, out, arm, seed), minutes(spent.get((arm, seed)))] + ["-"] * len(SPLITS)
            if cells[0] == FINISHED:
                cells[2:] = [format_rate(_wins(f), f.episodes) for f in final_successes(plan, out, arm, seed)]
            lines.append(f"| {seed} | {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def per_step_tables(runs: dict[str, list[Run]]) -> list[str]:
    """The figures' curves as numbers: for each metric of ``PER_STEP`` a run logged, each arm's mean over its runs
    (``{arm: [run of each seed]}``) at every RL step (markdown lines)."""
    lines = []
    for metric, title in PER_STEP.items():
        curves = {arm: mean_band([run.history[metric] for run in arm_runs if metric in run.history])
                  for arm, arm_runs in runs.items()}
        steps = sorted({x for xs, _, _ in curves.values() for x in xs})
        if not steps:
            continue
        lines += ["", f"### {title} (`{metric}`), mean over seeds, per RL step", "",
                  "| arm | " + " | ".join(f"{x:g}" for x in steps) + " |", "|---|" + "---|" * len(steps)]
        for arm, (xs, means, _) in curves.items():
            at = dict(zip(xs, means))
            lines.append(f"| {arm} | " + " | ".join(f"{at[x]:.3f}" if x in at else "-" for x in steps) + " |")
    return lines


PAIRED_CAPTION = (
    "Per seed: the arm's final success minus the other's (the same warm start; over the episodes paired per task where "
    "the runs recorded them). Over seeds: the mean with its 95 % Student t-interval ({df} degrees of freedom), and the "
    "smallest difference these seeds could detect with {power} power at the sd they showed (noncentral t). Evaluation "
    "noise only: Newcombe's interval of the pooled difference (paired per task, or the rates taken as unpaired), which "
    "holds the trained policies fixed: not an interval for another seed's training.")


def report(plan: Plan, out: Path) -> str:
    """The report's markdown (module docstring); draws the figures into ``DIR/figures/<PLAN>``."""
    arms, baseline = plan.compared, plan.compared[0]
    loaded = {arm: [load_run(run_dir(out, arm, seed), label=arm) for seed in plan.seeds] for arm in plan.arms}
    run_of = {(arm, seed): run for arm, runs in loaded.items() for seed, run in zip(plan.seeds, runs)}  # None: control
    finals = {(arm, seed, split): final
              for arm in arms for seed in plan.seeds
              for split, final in zip(SPLITS, final_successes(plan, out, arm, seed, run_of.get((arm, seed))))}
    lines = [f"# Comparison: experiment={plan.experiment}, seeds {plan.seeds}", "",
             f"Baseline: {baseline}. Common overrides: {' '.join(plan.common) or 'none'}.", "",
             "## Final success per arm (pooled over seeds, 95 % Wilson interval: evaluation noise only)", "",
             "The interval holds each trained policy fixed and redraws its episodes; how another seed would have "
             "trained is the paired differences' t-interval below.", "",
             "| arm | overrides | " + " | ".join(f"{s.upper()} success" for s in SPLITS) + " |",
             "|---|---|" + "---|" * len(SPLITS)]
    for arm in arms:
        cells = []
        for split in SPLITS:
            runs = [finals[arm, seed, split] for seed in plan.seeds]
            cells.append(format_rate(sum(_wins(f) for f in runs), sum(f.episodes for f in runs)))
        own = "the seed's warm start, evaluated (no RL)" if arm == plan.control else " ".join(plan.arms[arm]) or "-"
        lines.append(f"| {arm} | {own} | " + " | ".join(cells) + " |")
    pairs = [(arm, baseline) for arm in arms[1:]] + plan.contrasts
    for split in SPLITS:
        lines += ["", f"## {split.upper()}: paired differences (against {baseline}, then the plan's contrasts)", "",
                  PAIRED_CAPTION.format(df=len(plan.seeds) - 1, power=f"{POWER * 100:.0f} %"), "",
                  "| arm - other | " + " | ".join(f"s{seed}" for seed in plan.seeds) + " | mean | 95 % t-interval "
                  f"over seeds | smallest detectable ({POWER * 100:.0f} % power) | evaluation noise only (95 %) |",
                  "|---|" + "---|" * (len(plan.seeds) + 4)]
        for arm, other in pairs:
            found = contrast(out, plan, arm, other, split, finals)
            noise = f"{format_interval(*found.evaluation_noise)} {'paired' if found.paired else 'unpaired'}"
            cells = [f"{d:+.3f}" for d in found.differences] + [f"{sum(found.differences) / len(plan.seeds):+.3f}",
                                                                *seed_cells(found.seeds), noise]
            lines.append(f"| {arm} - {other} | " + " | ".join(cells) + " |")
    scored = [line for split in SPLITS for line in difference_lines(
        f"{split.upper()}: final score (`val/{split}/score`, the mean over the split's episodes)",
        {arm: [final_score(plan, out, arm, seed, split, run_of.get((arm, seed))) for seed in plan.seeds]
         for arm in arms}, plan.seeds, pairs)]
    lines += ["", "## Final score (the environment's own, where it scores its episodes)", *scored] if scored else []
    failures = failure_lines(plan, out, pairs)
    lines += ["", "## Episodes ended by a failure, or cut at the turn limit (where the environment fails them)",
              *failures] if failures else []
    figures = plot_loaded_runs([run for arm in plan.arms for run in loaded[arm]], out / "figures" / plan.name)
    lines += ["", "## Figures (mean and ±1 std over seeds, per arm)", ""]
    lines += [f"- [{path.name}]({path.relative_to(out)})" for path in figures]
    lines += ["", f"In wandb (offline; groups {plan.name}-<arm>): `wandb sync {out}/*/s*/wandb/*run-*`"]
    lines += ["", "## Per RL step"] + per_step_tables(loaded)
    trained = [(arm, other) for arm, other in pairs if plan.control not in (arm, other)]
    lines += ["", "## Over each run's RL steps (per seed; paired differences over seeds)"]
    lines += measure_lines(loaded, plan.seeds, trained)
    spent = wall_seconds(out)
    lines += ["", "## Wall time (the commands this tool ran; a seed's first arm includes its warm start)", "",
              "| arm | " + " | ".join(f"s{seed}" for seed in plan.seeds) + " |", "|---|" + "---|" * len(plan.seeds)]
    lines += [f"| {arm} | " + " | ".join(minutes(spent.get((arm, seed))) for seed in plan.seeds) + " |" for arm in arms]
    lines += ["", f"All runs: {minutes(sum(spent.get((arm, seed), 0.0) for arm in arms for seed in plan.seeds))}."]
    commands = out / COMMANDS
    ran = commands.read_text().splitlines() if commands.exists() else []
    ours = {f"hydra.run.dir={run_dir(out, arm, seed)}" for arm in arms for seed in plan.seeds}
    lines += ["", "## Commands", "", "```", *(line for line in ran if ours & set(line.split())), "```"]
    return "\n".join(lines) + "\n"
