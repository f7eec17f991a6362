"""The paper's success columns, and how much the entropy oscillates (EPO's claim), from run directories:

    python -m lightning_epo.reports.summary [LABEL=]RUN_DIR [[LABEL=]RUN_DIR ...] [--metric val/iid/success] [--window 5]
        [--from-step 1] [--markdown FILE]

- **Succ.\\*** : the best validation success of a run (max over its evaluations), averaged over seeds.
- **Succ.**  : the mean of a run's last ``--window`` evaluations ("after convergence"), averaged over seeds.
- **ΔH osc.** : the std over RL steps of ``H_k - H_{k-1}``, the step-to-step change of ``loss/entropy`` (L_H, Eq. 4:
  the trajectory-aggregated mean token entropy that the objective regularises), averaged over seeds. EPO's smoothing
  term is meant to make it small: entropy that drifts steadily scores low, entropy that swings up and down high.
- **ΔH early osc.** : the same for ``entropy/early_turns`` (mean token entropy over the first turns of trajectories).
- **Eval. (%)** : the metric in the run's ``eval.json``, what ``mode=eval ckpt_path=last`` wrote for its final policy
  (with ``env.val_size=300``: 300 episodes per split), averaged over the runs that have one.

An oscillation column averages the runs with at least 3 points of its metric (a std of at least two changes), and
says "(n of m runs)" when some runs of the group have fewer; it shows "n/a" when none has (the metric was not logged,
or the run is too short). Eval. does the same for the runs with an ``eval.json`` that holds the metric. The
oscillation columns use every logged step (``--from-step`` applies to evaluations).

``--from-step N`` keeps only the evaluations logged at RL step >= N: ``--from-step 1`` leaves out the starting
level that ``val_at_start=true`` logs at step 0 (otherwise Succ.* can never fall below the starting policy's score).

Runs are grouped by ``algo.name`` (and ``env.name`` when they differ) from each run's saved config; the
seeds of a group are its runs. History comes from ``RUN_DIR/csv/metrics.csv`` or the wandb files
(:mod:`lightning_epo.reports.run_history`). Success is printed in percent, as in the paper, entropy changes in nats,
each as mean ± std over seeds.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from lightning_epo.core import layout
from lightning_epo.core.errors import UserError, exit_with_error
from lightning_epo.reports.run_history import RUN_ARGS_HELP, Run, Series, group_runs, load_run_arg, seed_std

OSCILLATION = {"ΔH osc.": "loss/entropy", "ΔH early osc.": "entropy/early_turns"}  # column: metric
HEADER = ["algo", "runs", "seeds", "Succ.* (%)", "Succ. (%)", *OSCILLATION, "Eval. (%)"]


@dataclass
class RunScore:
    run: Run
    best: float  # max over the run's evaluations
    final: float  # mean of the last `window` evaluations
    evaluated: float | None  # the metric in the run's eval.json (its final policy's mode=eval), None without one


@dataclass
class GroupSummary:
    label: str
    seeds: list[int | None]
    succ_star: float  # mean over seeds of RunScore.best
    succ: float  # mean over seeds of RunScore.final
    succ_star_std: float
    succ_std: float
    oscillation: dict[str, list[float]]  # metric: its oscillation() in each run that has one
    evaluated: list[float]  # RunScore.evaluated of each run that has one


def oscillation(series: Series) -> float | None:
    """The std over RL steps of ``H_k - H_{k-1}`` (consecutive logged points); None below 3 points."""
    values = [v for _, v in series]
    if len(values) < 3:
        return None
    return statistics.stdev(b - a for a, b in zip(values, values[1:]))


def score_run(run: Run, metric: str, window: int, from_step: int = 0) -> RunScore:
    values = [v for step, v in run.history.get(metric, []) if step >= from_step]
    if not values:
        logged = sorted(k for k in run.history if k.startswith("val/")) or ["none"]
        raise UserError(f"{run.run_dir} has no '{metric}' points at step >= {from_step}; its validation metrics: "
                        f"{', '.join(logged)}")
    return RunScore(run, best=max(values), final=statistics.fmean(values[-window:]),
                    evaluated=final_evaluation(run, metric))


def final_evaluation(run: Run, metric: str) -> float | None:
    """``metric`` in ``RUN_DIR/eval.json`` (written by ``mode=eval``), None when the run has no such file or the
    file lacks the metric (an evaluation of other splits)."""
    path = run.run_dir / layout.EVAL
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text()).get(metric)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path} is not JSON ({exc}); write it again with mode=eval ckpt_path=last") from None
    return None if value is None else float(value)


def summarize(
    runs: list[Run], metric: str = "val/iid/success", window: int = 5, from_step: int = 0
) -> list[GroupSummary]:
    """One :class:`GroupSummary` per algorithm (fractions, not percent), over evaluations at step >= ``from_step``."""
    if window < 1:
        raise UserError(f"--window must be >= 1, got {window}")
    out = []
    for label, members in group_runs(runs).items():
        scores = [score_run(r, metric, window, from_step) for r in members]
        best, final = [s.best for s in scores], [s.final for s in scores]
        osc = {m: [x for r in members if (x := oscillation(r.history.get(m, []))) is not None]
               for m in OSCILLATION.values()}
        out.append(GroupSummary(label, [r.seed for r in members], statistics.fmean(best), statistics.fmean(final),
                                seed_std(best), seed_std(final), osc,
                                [s.evaluated for s in scores if s.evaluated is not None]))
    return out


def _mean_std(mean: float, std: float, n: int, spec: str) -> str:
    return f"{mean:{spec}}" + (f" ± {std:{spec}}" if n > 1 else "")


def _some_runs(values: list[float], runs: int, spec: str, scale: float = 1.0) -> str:
    """Mean ± std of the runs that have a value, "(n of m runs)" when not all do, "n/a" when none does."""
    if not values:
        return "n/a"
    some = f" ({len(values)} of {runs} runs)" if len(values) < runs else ""
    return _mean_std(scale * statistics.fmean(values), scale * seed_std(values), len(values), spec) + some


def _rows(summaries: list[GroupSummary]) -> list[list[str]]:
    return [
        [s.label, str(len(s.seeds)), ", ".join(str(x) for x in s.seeds),
         _mean_std(100 * s.succ_star, 100 * s.succ_star_std, len(s.seeds), ".1f"),
         _mean_std(100 * s.succ, 100 * s.succ_std, len(s.seeds), ".1f"),
         *[_some_runs(s.oscillation[m], len(s.seeds), ".4f") for m in OSCILLATION.values()],
         _some_runs(s.evaluated, len(s.seeds), ".1f", scale=100)]
        for s in summaries
    ]


def _caption(window: int, from_step: int) -> str:
    after = f" (evaluations at step >= {from_step})" if from_step else ""
    return (f"Succ.* = best evaluation, Succ. = mean of the last {window}{after}; ΔH osc. / ΔH early osc. = "
            "std over RL steps of H_k - H_{k-1} of loss/entropy (L_H) / entropy/early_turns, n/a below 3 points; "
            "Eval. = the final policy's eval.json (mode=eval); mean ± std over seeds")


def rich_table(summaries: list[GroupSummary], metric: str, window: int, from_step: int = 0) -> Table:
    table = Table(title=f"{metric}: {_caption(window, from_step)}")
    for i, name in enumerate(HEADER):
        table.add_column(name, justify="right" if i >= 1 else "left")
    for row in _rows(summaries):
        table.add_row(*row)
    return table


def markdown_table(summaries: list[GroupSummary], metric: str, window: int, from_step: int = 0) -> str:
    lines = [
        f"`{metric}`: {_caption(window, from_step)}.",
        "",
        "| " + " | ".join(HEADER) + " |",
        "| " + " | ".join(["---"] + ["---:"] * (len(HEADER) - 1)) + " |",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in _rows(summaries)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lightning_epo.reports.summary", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help=RUN_ARGS_HELP)
    parser.add_argument("--metric", default="val/iid/success", help="validation metric (default: val/iid/success)")
    parser.add_argument("--window", type=int, default=5, help="evaluations averaged for Succ. (default: 5)")
    parser.add_argument("--from-step", type=int, default=0,
                        help="only evaluations logged at RL step >= this (1: leave out val_at_start's; default: 0)")
    parser.add_argument("--markdown", type=Path, help="also write the table as markdown to this file")
    args = parser.parse_args(argv)
    try:
        summaries = summarize([load_run_arg(r) for r in args.runs], args.metric, args.window, args.from_step)
    except UserError as exc:
        exit_with_error(exc)
    Console().print(rich_table(summaries, args.metric, args.window, args.from_step))
    if args.markdown:
        args.markdown.write_text(markdown_table(summaries, args.metric, args.window, args.from_step))
        print(f"wrote {args.markdown}")


if __name__ == "__main__":
    main()
