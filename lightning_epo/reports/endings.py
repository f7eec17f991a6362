"""How runs' final evaluation episodes ended, per task: won, failed (ended by the task without a win), or cut at the
turn limit, each a count and a share with its 95 % Wilson interval, and the mean turns and return of each ending:

    python -m lightning_epo.reports.endings [LABEL=]RUN_DIR [[LABEL=]RUN_DIR ...] [--split iid|ood|both]

Each run's episodes are its ``eval_episodes.jsonl``'s final evaluation (:func:`final_episodes`): a training run's last
evaluation, or a ``mode=eval`` run's (a comparison's control) where the run has no training evaluation. A label
repeated pools its runs' episodes (several seeds, or an arm's runs and, repeated once per run, their controls); a run
without a label is labelled by its directory. A task is the suite's task name where the run recorded it
(``task_name``), else the task text's first sentence (ScienceWorld's texts differ by variation after it: the box, the
room). The endings are :func:`episode_ending`'s. A return is the run's own (its reward settings: pool runs that share them). Where a policy's wins went
when it lost them (docs/comparison_sciworld_token_mean.md).
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from lightning_epo.core.errors import UserError, exit_with_error
from lightning_epo.reports.eval_episodes import episode_ending, final_episodes
from lightning_epo.reports.run_history import split_run_arg
from lightning_epo.reports.wilson import wilson_interval

ENDINGS = ("won", "failed", "cut")
SPLITS = {"iid": ("iid",), "ood": ("ood",), "both": ("iid", "ood")}
ALL_TASKS = "all tasks"


def task_of(row: dict[str, Any]) -> str:
    """The episode's task: its ``task_name`` where recorded, else the first sentence of its task text."""
    return row.get("task_name") or row["task"].split(". ")[0].rstrip(".")


def run_episodes(run_dir: Path, splits: tuple[str, ...]) -> list[dict[str, Any]]:
    """The final evaluation's episodes of ``splits`` (a training run's, else a ``mode=eval`` run's); one error line
    where the run recorded none."""
    rows = []
    for split in splits:
        found = final_episodes(run_dir, split, "train") or final_episodes(run_dir, split, "eval")
        if found is None:
            raise UserError(f"{run_dir}: no {split} evaluation episodes in its eval_episodes.jsonl (a run from before "
                            "the record, or not a run directory): give run directories that evaluated")
        rows += found.values()
    return rows


def tally(episodes: list[dict[str, Any]]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Per task (and ``ALL_TASKS``), per ending, the episodes that ended so."""
    ended: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: {name: [] for name in ENDINGS})
    for row in episodes:
        for task in (task_of(row), ALL_TASKS):
            ended[task][episode_ending(row)].append(row)
    return dict(ended)


def share(count: int, n: int) -> str:
    """``count: share [low, high]``, the share in percent with its 95 % Wilson interval."""
    low, high = wilson_interval(count, n)
    return f"{count}: {100 * count / n:.1f} [{100 * low:.1f}, {100 * high:.1f}]"


def rows(ended: dict[str, dict[str, list[dict[str, Any]]]]) -> list[list[str]]:
    """Table rows: the task, its episodes, each ending's count and share (Wilson interval), and each ending's mean
    turns and mean return."""
    table = []
    for task in sorted(ended, key=lambda name: (name == ALL_TASKS, name)):
        by_ending = ended[task]
        n = sum(map(len, by_ending.values()))
        table.append([task, str(n), *(share(len(by_ending[name]), n) for name in ENDINGS),
                      means(by_ending, "turns", 1), means(by_ending, "return", 2)])
    return table


def means(by_ending: dict[str, list[dict[str, Any]]], key: str, digits: int) -> str:
    """``won / failed / cut``: each ending's mean ``key`` (``-`` where none ended so)."""
    return " / ".join(f"{statistics.mean(row[key] for row in by_ending[name]):.{digits}f}" if by_ending[name] else "-"
                      for name in ENDINGS)


def markdown(header: list[str], body: list[list[str]]) -> list[str]:
    """A markdown table's lines."""
    return [f"| {' | '.join(cells)} |" for cells in (header, ["---"] * len(header), *body)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lightning_epo.reports.endings",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run directories; LABEL=DIR pools the runs of one label")
    parser.add_argument("--split", choices=tuple(SPLITS), default="both",
                        help="the evaluation split(s) (default: both)")
    args = parser.parse_args(argv)
    episodes: dict[str, list[dict[str, Any]]] = defaultdict(list)
    try:
        for arg in args.runs:
            label, path = split_run_arg(arg)
            episodes[label or path] += run_episodes(Path(path), SPLITS[args.split])
    except UserError as exc:
        exit_with_error(exc)
    for label, found in episodes.items():
        print(f"\n{label}: final evaluation, {args.split} (count: share %, 95 % Wilson interval)\n")
        print("\n".join(markdown(["task", "episodes", *ENDINGS, "mean turns: won / failed / cut",
                                  "mean return: won / failed / cut"],
                                 rows(tally(found)))))


if __name__ == "__main__":
    main()
