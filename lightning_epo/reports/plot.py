"""The paper's training panels as PNGs, one line per algorithm, mean and a ±1 std band over seeds:

    python -m lightning_epo.reports.plot [LABEL=]RUN_DIR [[LABEL=]RUN_DIR ...] --out DIR

Writes to ``DIR``: ``train_reward.png``, ``val_iid_success.png``, ``val_ood_success.png`` (and any other
``val/<split>/success``), ``entropy_turns.png`` (early vs late turns, Fig. 1), ``entropy_tokens.png``
(early vs late tokens, Fig. 7d), ``mixed_groups.png`` (the share of collected groups with mixed outcomes, where the
run logs it: ``algo.group_size`` > 1) and ``entropy_by_turn.png`` (mean entropy at each turn index, first vs
second half of training, from ``RUN_DIR/turn_entropy.jsonl``). A panel no run has data for is skipped.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from lightning_epo.core import layout  # noqa: E402
from lightning_epo.core.errors import UserError, exit_with_error  # noqa: E402
from lightning_epo.reports.run_history import RUN_ARGS_HELP, Run, Series, group_runs, load_run_arg, seed_std  # noqa: E402

Curve = tuple[list[float], list[float], list[float]]  # x, mean, std


@dataclass
class Panel:
    filename: str
    title: str
    ylabel: str
    metrics: list[tuple[str, str, str]]  # (metric, legend suffix, line style)
    ylim: tuple[float, float] | None = None  # success rates: the whole [0, 1], so panels compare at a glance


def panels_for(runs: list[Run]) -> list[Panel]:
    """The metric panels, with one success panel per validation split any run logged."""
    splits = {k.split("/")[1] for r in runs for k in r.history if k.startswith("val/") and k.endswith("/success")}
    return [
        Panel("train_reward.png", "Training reward", "episode return", [("train/reward", "", "-")]),
        *[Panel(f"val_{s}_success.png", f"{s.upper()} success", "success rate", [(f"val/{s}/success", "", "-")],
                ylim=(-0.02, 1.02))
          for s in sorted(splits)],
        Panel("entropy_turns.png", "Entropy: early vs late turns (Fig. 1)", "token entropy",
              [("entropy/early_turns", " · early turns", "-"), ("entropy/late_turns", " · late turns", "--")]),
        Panel("entropy_tokens.png", "Entropy: early vs late tokens (Fig. 7d)", "token entropy",
              [("entropy/early_tokens", " · early tokens", "-"), ("entropy/late_tokens", " · late tokens", "--")]),
        Panel("mixed_groups.png", "Groups whose rollouts mix wins and losses (algo.group_size > 1)", "share of groups",
              [("train/mixed_groups", "", "-")], ylim=(-0.02, 1.02)),
    ]


def mean_band(series: list[list[tuple[float, float | None]]]) -> Curve:
    """Mean and std (:func:`seed_std`) over seeds at every x any seed has (each x averages the seeds that have it; None and
    non-finite values are left out)."""
    at: dict[float, list[float]] = {}
    for s in series:
        for x, y in s:
            if y is not None and math.isfinite(y):
                at.setdefault(x, []).append(y)
    xs = sorted(at)
    return xs, [statistics.fmean(at[x]) for x in xs], [seed_std(at[x]) for x in xs]


def _draw(ax, curve: Curve, label: str, color: str, style: str) -> None:
    xs, mean, std = curve
    ax.plot(xs, mean, style, color=color, label=label, marker="o" if len(xs) <= 30 else None, markersize=3)
    if any(std):
        low, high = [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)]
        ax.fill_between(xs, low, high, color=color, alpha=0.2)


def _save(fig, ax, path: Path) -> Path:
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # RL steps and turn indices
    ax.ticklabel_format(axis="y", useOffset=False)  # entropy 7.1903 reads better than "+7.19" and 0.0003
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _colors(labels: list[str]) -> dict[str, str]:
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {label: cycle[i % len(cycle)] for i, label in enumerate(labels)}


def plot_metric_panel(panel: Panel, groups: dict[str, list[Run]], out: Path) -> Path | None:
    """Draw ``panel`` (one colour per group, one line style per metric); None when no run logged it."""
    colors = _colors(list(groups))
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    drawn = False
    for label, runs in groups.items():
        for metric, suffix, style in panel.metrics:
            series: list[Series] = [r.history[metric] for r in runs if metric in r.history]
            if series:
                _draw(ax, mean_band(series), label + suffix, colors[label], style)
                drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set(title=panel.title, xlabel="RL step", ylabel=panel.ylabel)
    if panel.ylim:
        ax.set_ylim(*panel.ylim)
    return _save(fig, ax, out / panel.filename)


def read_turn_entropy(run_dir: Path) -> dict[int, list[float | None]]:
    """``{step: [entropy per turn index]}`` from ``turn_entropy.jsonl`` (a resumed run's later line wins)."""
    path = run_dir / layout.TURN_ENTROPY
    if not path.is_file():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {int(row["step"]): row["entropy"] for row in rows}


def _turn_profile(by_step: dict[int, list[float | None]], steps: list[int]) -> list[tuple[float, float]]:
    """Mean over ``steps`` of the entropy at each turn index: ``[(turn, mean), ...]``."""
    xs, mean, _ = mean_band([list(enumerate(by_step[s])) for s in steps])
    return list(zip(xs, mean))


def plot_turn_entropy(groups: dict[str, list[Run]], out: Path) -> Path | None:
    """Entropy at each turn index, averaged over the first and over the second half of each run's steps,
    then mean ± std over seeds; None when no run has ``turn_entropy.jsonl``."""
    colors = _colors(list(groups))
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    drawn = False
    for label, runs in groups.items():
        halves: dict[str, list[list[tuple[float, float]]]] = {"first": [], "second": []}
        for run in runs:
            by_step = read_turn_entropy(run.run_dir)
            steps = sorted(by_step)
            cut = (len(steps) + 1) // 2
            for half, picked in (("first", steps[:cut]), ("second", steps[cut:])):
                if picked:
                    halves[half].append(_turn_profile(by_step, picked))
        for half, style in (("first", "-"), ("second", "--")):
            if halves[half]:
                _draw(ax, mean_band(halves[half]), f"{label} · {half} half of training", colors[label], style)
                drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set(title="Entropy by turn index", xlabel="turn index", ylabel="token entropy")
    return _save(fig, ax, out / "entropy_by_turn.png")


def plot_runs(run_args: list[str], out: Path) -> list[Path]:
    """Every panel the runs (``DIR`` or ``LABEL=DIR``) have data for; returns the written PNG paths."""
    return plot_loaded_runs([load_run_arg(str(r)) for r in run_args], out)


def plot_loaded_runs(runs: list[Run], out: Path) -> list[Path]:
    """:func:`plot_runs` of runs already loaded (grouped by their labels)."""
    groups = group_runs(runs)
    out.mkdir(parents=True, exist_ok=True)
    written = [plot_metric_panel(p, groups, out) for p in panels_for(runs)] + [plot_turn_entropy(groups, out)]
    return [p for p in written if p is not None]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lightning_epo.reports.plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help=RUN_ARGS_HELP)
    parser.add_argument("--out", type=Path, required=True, help="folder for the PNGs")
    args = parser.parse_args(argv)
    try:
        written = plot_runs(args.runs, args.out)
    except UserError as exc:
        exit_with_error(exc)
    for path in written:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
