"""The paper's success columns from run directories:

    python -m lightning_epo.summary [LABEL=]RUN_DIR [[LABEL=]RUN_DIR ...] [--metric val/iid/success] [--window 5]
        [--from-step 1] [--markdown FILE]

- **Succ.\\*** : the best validation success of a run (max over its evaluations), averaged over seeds.
- **Succ.**  : the mean of a run's last ``--window`` evaluations ("after convergence"), averaged over seeds.

``--from-step N`` keeps only the evaluations logged at RL step >= N: ``--from-step 1`` leaves out the starting
level that ``val_at_start=true`` logs at step 0 (otherwise Succ.* can never fall below the starting policy's score).

Runs are grouped by ``algo.name`` (and ``env.name`` when they differ) from each run's saved config; the
seeds of a group are its runs. History comes from ``RUN_DIR/csv/metrics.csv`` or the wandb files
(:mod:`lightning_epo.run_history`). Values are printed in percent, as in the paper, mean ± std over seeds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from lightning_epo.errors import UserError
from lightning_epo.run_history import RUN_ARGS_HELP, Run, group_runs, load_run_arg, seed_std


HEADER = ["algo", "runs", "seeds", "Succ.* (%)", "Succ. (%)"]


@dataclass
class RunScore:
    run: Run
    best: float  # max over the run's evaluations
    final: float  # mean of the last `window` evaluations


@dataclass
class GroupSummary:
    label: str
    seeds: list[int | None]
    succ_star: float  # mean over seeds of RunScore.best
    succ: float  # mean over seeds of RunScore.final
    succ_star_std: float
    succ_std: float


def score_run(run: Run, metric: str, window: int, from_step: int = 0) -> RunScore:
    values = [v for step, v in run.history.get(metric, []) if step >= from_step]
    if not values:
        logged = sorted(k for k in run.history if k.startswith("val/")) or ["none"]
        raise UserError(f"{run.run_dir} has no '{metric}' points at step >= {from_step}; its validation metrics: "
                        f"{', '.join(logged)}")
    return RunScore(run, best=max(values), final=statistics.fmean(values[-window:]))


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
        out.append(GroupSummary(label, [r.seed for r in members], statistics.fmean(best), statistics.fmean(final),
                                seed_std(best), seed_std(final)))
    return out


def _pct(mean: float, std: float, n: int) -> str:
    return f"{100 * mean:.1f}" + (f" ± {100 * std:.1f}" if n > 1 else "")


def _rows(summaries: list[GroupSummary]) -> list[list[str]]:
    return [
        [s.label, str(len(s.seeds)), ", ".join(str(x) for x in s.seeds),
         _pct(s.succ_star, s.succ_star_std, len(s.seeds)), _pct(s.succ, s.succ_std, len(s.seeds))]
        for s in summaries
    ]


def _evaluations(window: int, from_step: int) -> str:
    after = f" (evaluations at step >= {from_step})" if from_step else ""
    return f"Succ.* = best evaluation, Succ. = mean of the last {window}{after}; mean ± std over seeds"


def rich_table(summaries: list[GroupSummary], metric: str, window: int, from_step: int = 0) -> Table:
    table = Table(title=f"{metric}: {_evaluations(window, from_step)}")
    for i, name in enumerate(HEADER):
        table.add_column(name, justify="right" if i >= 1 else "left")
    for row in _rows(summaries):
        table.add_row(*row)
    return table


def markdown_table(summaries: list[GroupSummary], metric: str, window: int, from_step: int = 0) -> str:
    lines = [
        f"`{metric}`: {_evaluations(window, from_step)}.",
        "",
        "| " + " | ".join(HEADER) + " |",
        "| " + " | ".join(["---"] + ["---:"] * (len(HEADER) - 1)) + " |",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in _rows(summaries)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lightning_epo.summary", description=__doc__.split("\n\n")[0])
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
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    Console().print(rich_table(summaries, args.metric, args.window, args.from_step))
    if args.markdown:
        args.markdown.write_text(markdown_table(summaries, args.metric, args.window, args.from_step))
        print(f"wrote {args.markdown}")


if __name__ == "__main__":
    main()
