"""Measures of a run's whole course of RL steps, beside its final success: the largest early-turn entropy, how much
the early-turn entropy moves from step to step, the share of tokens outside Eq. 5's band. Per arm and seed, and as
paired differences over seeds with the t-interval of :mod:`lightning_epo.reports.paired` (the seed is the unit)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

from lightning_epo.reports.paired import POWER, seed_cells, seed_interval
from lightning_epo.reports.run_history import Run, Series


def largest(series: Series) -> float | None:
    """The largest value over the run's steps: max_k x_k."""
    values = [y for _, y in series]
    return max(values) if values else None


def change_variance(series: Series) -> float | None:
    """The sample variance of the step-to-step change x_{k+1} - x_k (over steps in order; at least 3 steps)."""
    values = [y for _, y in sorted(series)]
    changes = [after - before for before, after in zip(values, values[1:])]
    return statistics.variance(changes) if len(changes) > 1 else None


def mean_from_step_one(series: Series) -> float | None:
    """The mean over steps k >= 1 (the window has no H̄ at step 0)."""
    values = [y for x, y in series if x >= 1]
    return statistics.fmean(values) if values else None


MEASURES: dict[str, tuple[str, Callable[[Series], float | None]]] = {
    "Largest early-turn entropy over the RL steps (nat): max_k `entropy/early_turns`": (
        "entropy/early_turns", largest),
    "Variance of the early-turn entropy's step-to-step change (nat²)": ("entropy/early_turns", change_variance),
    "Share of response tokens outside Eq. 5's band, mean over steps k >= 1 (`epo/out_of_range_frac`)": (
        "epo/out_of_range_frac", mean_from_step_one),
}


def measure(run: Run, metric: str, how: Callable[[Series], float | None]) -> float | None:
    """``how`` of the run's ``metric`` history, None where the run did not log it."""
    return how(run.history[metric]) if metric in run.history else None


def measure_lines(runs: dict[str, list[Run]], seeds: Sequence[int], pairs: Sequence[tuple[str, str]]) -> list[str]:
    """:func:`difference_lines` of each of :data:`MEASURES` any run logged (``runs``: ``{arm: [run of each seed]}``)."""
    lines = []
    for title, (metric, how) in MEASURES.items():
        values = {arm: [measure(run, metric, how) for run in arm_runs] for arm, arm_runs in runs.items()}
        lines += difference_lines(title, values, seeds, pairs)
    return lines


def difference_lines(title: str, values: dict[str, list[float | None]], seeds: Sequence[int],
                     pairs: Sequence[tuple[str, str]]) -> list[str]:
    """Markdown under ``title``: each arm's value per seed (``values``: ``{arm: [value of each seed, None where the
    run has none]}``), then each pair ``(arm, other)`` of arms that both have one at every seed: the per-seed
    differences, their mean, and over 2+ seeds the 95 % t-interval and the smallest difference detectable at 80 %
    power. Nothing where no run has a value."""
    if all(v is None for row in values.values() for v in row):
        return []
    lines = ["", f"### {title}", "", "| arm | " + " | ".join(f"s{seed}" for seed in seeds) + " |",
             "|---|" + "---|" * len(seeds)]
    lines += [f"| {arm} | " + " | ".join("-" if v is None else f"{v:.4g}" for v in row) + " |"
              for arm, row in values.items()]
    known = [(arm, other) for arm, other in pairs
             if all(v is not None for v in values.get(arm, [None]) + values.get(other, [None]))]
    if not known:
        return lines
    lines += ["", "| arm - other | " + " | ".join(f"s{seed}" for seed in seeds) + " | mean | 95 % t-interval "
              f"over seeds | smallest detectable ({POWER * 100:.0f} % power) |", "|---|" + "---|" * (len(seeds) + 3)]
    for arm, other in known:
        differences = [a - b for a, b in zip(values[arm], values[other])]
        tail = seed_cells(seed_interval(differences) if len(differences) > 1 else None, "+.4g", ".3g")
        lines.append(f"| {arm} - {other} | " + " | ".join(f"{d:+.4g}" for d in differences)
                     + f" | {statistics.fmean(differences):+.4g} | " + " | ".join(tail) + " |")
    return lines
