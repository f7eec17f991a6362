"""The small-paired-design analysis: Student's t by quadrature against tabulated quantiles, the smallest detectable
difference against its power, a planted null and a planted difference, and the t-interval's coverage by simulation
from the spread of paired differences (not of levels)."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from lightning_epo.reports.paired import (
    contrast_from_pairs, contrast_from_rates, detectable_noncentrality, main, seed_interval, t_power, t_quantile,
)
from lightning_epo.reports.wilson import newcombe_interval, newcombe_paired_interval

# Student's t quantiles, tabulated (R's qt; scipy.stats.t.ppf gives the same digits)
TABLE = [(0.975, 1, 12.7062047), (0.975, 2, 4.3026527), (0.975, 3, 3.1824463), (0.8, 3, 0.9784723),
         (0.975, 9, 2.2621572), (0.975, 29, 2.0452296), (0.975, 100, 1.9839715), (0.025, 3, -3.1824463)]
# Comparison A's per-seed final IID success of arms c and a (docs/comparison_real_model.md): levels far apart (0.13 to
# 0.86 in a), paired differences spread 0.26
A_IID = {"a": [0.76, 0.32, 0.13, 0.86], "c": [0.40, 0.57, 0.10, 0.71]}


@pytest.mark.parametrize("q, df, expected", TABLE)
def test_the_t_quantile_is_the_tabulated_one(q, df, expected):
    assert t_quantile(q, df) == pytest.approx(expected, abs=2e-7)


def test_the_smallest_detectable_difference_has_the_power_it_claims():
    for df in (1, 3, 9):
        assert t_power(0.0, df) == pytest.approx(0.05, abs=1e-9)  # no effect: the test's own level
        assert t_power(detectable_noncentrality(df), df) == pytest.approx(0.8, abs=1e-9)
    # noncentral t is wider than the shortcut (t_0.975 + t_0.8) at 4 seeds: 4.256 standard errors, not 4.161
    assert detectable_noncentrality(3) == pytest.approx(4.2559, abs=1e-3)
    assert t_quantile(0.975, 3) + t_quantile(0.8, 3) == pytest.approx(4.1609, abs=1e-3)
    # by simulation: 4 seeds whose paired differences are N(δ, σ), δ the smallest detectable difference for the true σ
    rng, sigma = np.random.default_rng(0), 0.1
    delta = detectable_noncentrality(3) * sigma / 2
    d = rng.normal(delta, sigma, size=(40_000, 4))
    half = t_quantile(0.975, 3) * d.std(axis=1, ddof=1) / 2
    rejected = float(np.mean(np.abs(d.mean(axis=1)) > half))
    assert rejected == pytest.approx(0.80, abs=0.01), rejected  # 0.800 (80.01 %)


def test_a_planted_null_is_not_a_difference_and_a_planted_difference_is():
    null = seed_interval([0.02, -0.01, 0.00, -0.01])
    assert null.low < 0 < null.high and null.mean == pytest.approx(0.0)
    planted = seed_interval([0.20, 0.25, 0.18, 0.22])
    assert planted.mean == pytest.approx(0.2125) and planted.low > 0
    half = t_quantile(0.975, 3) * statistics.stdev(planted.differences) / 2
    assert (planted.low, planted.high) == pytest.approx((0.2125 - half, 0.2125 + half))
    assert planted.detectable == pytest.approx(4.2559 * statistics.stdev(planted.differences) / 2, rel=1e-3)
    # the interval is mirrored when the arms swap, and narrower than the sign-flip permutation can ever be decisive:
    # at 4 seeds the permutation's smallest two-sided p is 2 / 2^4 = 0.125, while this one excludes 0
    swapped = seed_interval([-d for d in planted.differences])
    assert (swapped.low, swapped.high) == pytest.approx((-planted.high, -planted.low))


def test_the_interval_excludes_zero_in_five_percent_of_simulated_nulls():
    """The 95 % interval's false-positive rate when the arms do not differ, simulated at 4 seeds with comparison A's
    spread of paired differences: seed levels drawn from arm a's (0.13-0.86, shared by both arms of a seed: they cancel
    in the difference), each arm's training shift around its seed's level N(0, s_d / √2) with s_d the observed sd of
    c - a (0.26), then 100 tasks each, both arms' episodes of a task drawn from one stream half of the time (the same
    sampling streams) and from independent ones otherwise. Seeded: 20 000 simulated comparisons exclude 0 in 4.35 %
    (a little under 5 %: rates clipped at 0 and 1, and differences in steps of 0.01); normally distributed differences
    with the same spread, 40 000 comparisons: 5.08 %."""
    rng = np.random.default_rng(63)
    spread = statistics.stdev(c - a for c, a in zip(A_IID["c"], A_IID["a"]))
    simulations, seeds, tasks = 20_000, 4, 100
    level = rng.choice(A_IID["a"], size=(simulations, seeds, 1))
    shift = rng.normal(0.0, spread / math.sqrt(2), size=(simulations, seeds, 2))
    rate = np.clip(level + shift, 0.0, 1.0)  # [simulations, seeds, arm]
    shared = rng.random((simulations, seeds, tasks, 1))
    own = rng.random((simulations, seeds, tasks, 2))
    stream = np.where(rng.random((simulations, seeds, tasks, 1)) < 0.5, shared, own)
    won = stream < rate[:, :, None, :]  # [simulations, seeds, tasks, arm]
    d = won[..., 0].mean(axis=2) - won[..., 1].mean(axis=2)  # paired differences per seed
    half = t_quantile(0.975, seeds - 1) * d.std(axis=1, ddof=1) / math.sqrt(seeds)
    excluded = float(np.mean(np.abs(d.mean(axis=1)) > half))
    print(f"binary null: the 95 % interval excludes 0 in {excluded:.2%} of {simulations} simulated comparisons")
    assert excluded == pytest.approx(0.05, abs=0.01), excluded  # 4.35 %

    normal = rng.normal(0.0, spread, size=(40_000, seeds))
    half = t_quantile(0.975, seeds - 1) * normal.std(axis=1, ddof=1) / math.sqrt(seeds)
    excluded = float(np.mean(np.abs(normal.mean(axis=1)) > half))
    print(f"normal null: the 95 % interval excludes 0 in {excluded:.2%} of 40000 simulated comparisons")
    assert excluded == pytest.approx(0.05, abs=0.004), excluded  # 5.08 %


def test_episodes_paired_per_task_give_the_rate_difference_and_a_narrower_evaluation_noise_interval():
    # seed s: 100 tasks, the arm wins the other's wins and 10 more (+0.10 at every seed but one, +0.05 there)
    def seed(other_wins, extra):
        return [(True, True)] * other_wins + [(True, False)] * extra + [(False, False)] * (100 - other_wins - extra)

    pairs = [seed(40, 10), seed(60, 10), seed(20, 5), seed(70, 10)]
    paired = contrast_from_pairs(pairs)
    rates = contrast_from_rates([(50, 100), (70, 100), (25, 100), (80, 100)], [(40, 100), (60, 100), (20, 100),
                                                                              (70, 100)])
    for field in ("differences", "mean", "sd", "low", "high", "detectable"):  # the same differences and t-interval
        assert getattr(paired.seeds, field) == pytest.approx(getattr(rates.seeds, field), abs=1e-12)
    assert paired.differences == pytest.approx((0.10, 0.10, 0.05, 0.10))
    assert paired.paired and not rates.paired and paired.episodes == rates.episodes == 400
    paired_width = paired.evaluation_noise[1] - paired.evaluation_noise[0]
    unpaired_width = rates.evaluation_noise[1] - rates.evaluation_noise[0]
    assert paired_width < unpaired_width / 2  # pairs that agree on most tasks: the noise of a difference mostly cancels


def test_one_seed_has_its_difference_and_no_interval_over_seeds():
    pilot = contrast_from_rates([(30, 100)], [(45, 100)])
    assert pilot.differences == pytest.approx((-0.15,)) and pilot.seeds is None
    with pytest.raises(ValueError, match="at least 2 seeds"):
        seed_interval([-0.15])


def test_the_paired_newcombe_interval_is_the_independent_one_when_the_pairs_are_uncorrelated():
    assert newcombe_paired_interval(25, 25, 25, 25) == pytest.approx(newcombe_interval(50, 100, 50, 100))
    low, high = newcombe_paired_interval(36, 12, 2, 0)  # p1 = 0.96, p2 = 0.76 over 50 pairs
    assert low < 0.2 < high and 0 < low and high < 1


def test_the_command_line_prints_the_three_lines(capsys):
    main(["--arm", "85", "82", "83", "85", "--other", "85", "82", "83", "83", "--episodes", "100"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "per seed: +0.000 +0.000 +0.000 +0.020"
    assert lines[1].startswith("over seeds (4, t with 3 df): +0.005 [-0.011, +0.021], sd 0.010;")
    assert lines[2].startswith("evaluation noise only (400 episodes pooled, Newcombe, the rates as independent): ")
