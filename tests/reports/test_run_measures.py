"""A run's measures over its RL steps and their paired differences over seeds (reports/comparison/run_measures.py)."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import pytest

from lightning_epo.reports.comparison.run_measures import (change_variance, difference_lines, largest,
                                                            mean_from_step_one, measure_lines)
from lightning_epo.reports.paired import NO_SPREAD, Contrast, describe, seed_interval
from lightning_epo.reports.run_history import Run


def run(early: list[float], band: list[float] | None = None) -> Run:
    history = {"entropy/early_turns": list(enumerate(early))}
    if band is not None:
        history["epo/out_of_range_frac"] = [(k + 1, v) for k, v in enumerate(band)]  # logged from step 1
    return Run(Path("r"), "gridworld", "grpo_epo", 0, history, "arm")


def test_each_measure_of_a_series():
    series = [(0, 0.2), (1, 0.5), (2, 0.4), (3, 1.0)]
    assert largest(series) == 1.0
    assert change_variance(series) == pytest.approx(statistics.variance([0.3, -0.1, 0.6]))
    assert mean_from_step_one(series) == pytest.approx(statistics.fmean([0.5, 0.4, 1.0]))
    assert largest([]) is None and change_variance(series[:2]) is None and mean_from_step_one(series[:1]) is None


def test_paired_differences_per_seed_and_their_interval_over_seeds():
    seeds = [0, 1, 2, 3]
    runs = {"a": [run([0.2, 0.3, 0.25]), run([0.1, 0.2, 0.2]), run([0.3, 0.2, 0.1]), run([0.2, 0.2, 0.3])],
            "b": [run([0.2, 0.9, 1.3], [0.1, 0.2]), run([0.1, 0.6, 0.8], [0.1, 0.1]),
                  run([0.3, 0.5, 1.1], [0.2, 0.3]), run([0.2, 0.7, 0.7], [0.0, 0.1])]}
    lines = "\n".join(measure_lines(runs, seeds, [("b", "a")]))
    largest_table = lines.split("### Largest")[1].split("###")[0]
    (row,) = [line for line in largest_table.splitlines() if line.startswith("| b - a |")]
    name, *per_seed, mean, interval, detectable = row.strip("| ").split(" | ")
    differences = [1.3 - 0.3, 0.8 - 0.2, 1.1 - 0.3, 0.7 - 0.3]
    assert [float(x) for x in per_seed] == pytest.approx(differences, abs=1e-3)
    expected = seed_interval(differences)
    assert float(mean) == pytest.approx(expected.mean, abs=1e-3)
    low, high = re.fullmatch(r"\[(.+), (.+)\]", interval).groups()
    assert [float(low), float(high)] == pytest.approx([expected.low, expected.high], abs=1e-3)
    assert float(detectable) == pytest.approx(expected.detectable, rel=1e-2)
    assert "| a | 0.3 | 0.2 | 0.3 | 0.3 |" in largest_table
    band = lines.split("### Share")[1]
    assert "| b | 0.15 | 0.1 | 0.25 | 0.05 |" in band and "| a | - | - | - | - |" in band
    assert "b - a" not in band  # a did not log it: no difference to take


def test_the_same_difference_at_every_seed_gives_no_interval_and_no_detectable_difference():
    """Both arms at 0 wins at every seed (ScienceWorld's success, 2026-12-03) gave ``[+0, +0]`` and a smallest
    detectable difference of 0: a 0-wide interval from no spread, read as a design that detects anything."""
    lines = difference_lines("success", {"arm": [0.0, 0.0, 0.0], "base": [0.0, 0.0, 0.0]}, [0, 1, 2], [("arm", "base")])
    (row,) = [line for line in lines if line.startswith("| arm - base |")]
    assert row.endswith(f"| {NO_SPREAD} | {NO_SPREAD} |")
    assert describe_seeds([0.25, 0.25, 0.25]) == f"over seeds (3): +0.250, {NO_SPREAD}"
    assert describe_seeds([0.25, 0.2, 0.3]).startswith("over seeds (3, t with 2 df): +0.250 [")  # a spread: it stands


def describe_seeds(differences: list[float]) -> str:
    """The over-seeds line of :func:`describe` for a contrast with these per-seed differences."""
    return describe(Contrast(tuple(differences), seed_interval(differences), (0.0, 0.0), True, 10))[1]
