"""A difference of two arms over a handful of seeds, with an interval honest at that size and the smallest difference
the design can detect (DESIGN.md, "Reproducibility and comparisons"):

    python -m lightning_epo.reports.paired --arm 40 57 10 71 --other 76 32 13 86 --episodes 100
        # wins per seed of each arm, the same seeds in the same order; the evaluation's episodes (one, or one a seed)

The unit of pairing is the seed: the arms of seed s start from its one warm start and play the same tasks from the same
sampling streams, so the seed's paired difference ``d_s = p_arm,s - p_other,s`` (s = 1..S; over the episodes paired
per task where the runs recorded them, lightning_epo/callbacks/eval_episodes.py) carries what differs between the
arms, the spread of training and that of evaluation, but not the seed's own level. Over seeds, Student's t with
``S - 1`` degrees of freedom:

    d̄ = 1/S Σ_s d_s,   sd = sqrt(1/(S-1) Σ_s (d_s - d̄)²),   se = sd / √S
    95 % interval:  d̄ ± t_{0.975, S-1} · se                                      (t_{0.975, 3} = 3.182 at 4 seeds)
    smallest detectable difference at 80 % power:  δ = ncp · se, with ncp solving
        P(T' > t_{0.975, S-1}) + P(T' < -t_{0.975, S-1}) = 0.8,   T' noncentral t (S - 1 df, noncentrality ncp)

(about (t_{0.975, S-1} + t_{0.8, S-1}) · se, which is optimistic at 4 seeds). δ is computed from the observed sd, so it
is as uncertain as that sd: it says what this many seeds could resolve if the spread is what it looked like.

Why this interval: a percentile bootstrap over 4 seeds resamples 4 values (at most 35 distinct resamples) and is too
narrow; a sign-flip permutation over S seeds has 2^S sign patterns, so its smallest two-sided p is 2 / 2^S = 0.125 at
4 seeds and it can never reject at 5 %. The t-interval assumes the d_s roughly normal; tests/reports/test_paired.py
checks its coverage by simulation.

Beside it, the pooled interval of the difference (:mod:`lightning_epo.reports.wilson`: Newcombe's, paired per task
where the episodes are, else as independent rates) is **evaluation noise only**: it holds the trained policies fixed and
redraws their episodes, and says nothing of how another seed would have trained.

The t distribution by quadrature: with T' = (Z + ncp) / sqrt(V / ν), Z ~ N(0, 1), V ~ χ²_ν, U = √V ~ χ_ν,

    P(T' > x) = E_U[Φ(ncp - x U / √ν)] = ∫_0^∞ g_ν(u) Φ(ncp - x u / √ν) du,
    g_ν(u) = u^(ν-1) e^(-u²/2) / (2^(ν/2-1) Γ(ν/2))   (the χ_ν density)

on a Simpson grid (error below 1e-9); quantiles by bisection on it. (scipy is not a dependency of the project.)
"""

from __future__ import annotations

import argparse
import math
import statistics
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np

from lightning_epo.reports.wilson import newcombe_interval, newcombe_paired_interval

LEVEL = 0.95  # two-sided
POWER = 0.8
_NODES = 4001  # Simpson's rule: an odd count
_BISECTIONS = 80


@lru_cache(maxsize=64)
def _chi_weights(df: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes ``u [_NODES]`` on ``[0, √df + 12]`` and weights ``w [_NODES]`` with ``Σ w f(u) ≈ E[f(U)]``, U ~ χ_df:
    Simpson's weights times the density ``g_df(u)`` (module docstring)."""
    if df < 1:
        raise ValueError(f"need at least 1 degree of freedom (2 seeds), got {df}")
    u = np.linspace(0.0, math.sqrt(df) + 12.0, _NODES)
    with np.errstate(divide="ignore"):  # u = 0: g = 0 for df > 1 (and 1 · e^0 / ... for df = 1, where u^0 = 1)
        log_u = (df - 1) * np.log(u) if df > 1 else np.zeros_like(u)
    log_g = log_u - u * u / 2 - (df / 2 - 1) * math.log(2) - math.lgamma(df / 2)
    simpson = np.ones(_NODES)
    simpson[1:-1:2], simpson[2:-1:2] = 4.0, 2.0
    return u, simpson * (u[1] - u[0]) / 3 * np.exp(log_g)


def _normal_cdf(x: np.ndarray) -> np.ndarray:
    """Φ elementwise, through erfc (accurate in the lower tail)."""
    return np.array([0.5 * math.erfc(-v / math.sqrt(2)) for v in x.ravel()]).reshape(x.shape)


def t_tail(x: float, df: int, noncentrality: float = 0.0) -> float:
    """``P(T' > x)`` for T' the (noncentral) t with ``df`` degrees of freedom (module docstring)."""
    u, w = _chi_weights(df)
    return float(np.sum(w * _normal_cdf(noncentrality - x * u / math.sqrt(df))))


def _bisect(f, low: float, high: float) -> float:
    """The root of ``f``, decreasing on ``[low, high]`` with ``f(low) >= 0 >= f(high)``."""
    for _ in range(_BISECTIONS):
        middle = (low + high) / 2
        low, high = (middle, high) if f(middle) > 0 else (low, middle)
    return (low + high) / 2


@lru_cache(maxsize=256)
def t_quantile(q: float, df: int) -> float:
    """``x`` with ``P(T <= x) = q`` for Student's t with ``df`` degrees of freedom (e.g. ``t_quantile(0.975, 3)`` =
    3.1824)."""
    if not 0 < q < 1:
        raise ValueError(f"a quantile needs 0 < q < 1, got {q}")
    if q < 0.5:
        return -t_quantile(1 - q, df)
    high = 1.0
    while t_tail(high, df) > 1 - q:
        high *= 2
    return _bisect(lambda x: t_tail(x, df) - (1 - q), 0.0, high)


def t_power(noncentrality: float, df: int, level: float = LEVEL) -> float:
    """The chance that the two-sided ``level`` t-test rejects when the true mean is ``noncentrality`` standard errors
    from 0: ``P(T' > c) + P(T' < -c)``, c = t_{(1+level)/2, df}."""
    c = t_quantile((1 + level) / 2, df)
    return t_tail(c, df, noncentrality) + t_tail(c, df, -noncentrality)


@lru_cache(maxsize=256)
def detectable_noncentrality(df: int, level: float = LEVEL, power: float = POWER) -> float:
    """The ``ncp`` at which :func:`t_power` is ``power``: the smallest detectable difference in standard errors."""
    return _bisect(lambda ncp: power - t_power(ncp, df, level), 0.0, 100.0)


@dataclass(frozen=True)
class SeedInterval:
    """The mean paired difference over seeds, its t-interval and the smallest difference the design can detect
    (module docstring), from the per-seed ``differences [S]``."""

    differences: tuple[float, ...]
    mean: float
    sd: float
    low: float
    high: float
    detectable: float  # δ at POWER, in the differences' unit

    @property
    def spread(self) -> bool:
        """False where every seed's difference is the same (sd 0 up to rounding): the interval and δ are then 0 wide
        and say nothing about another seed (e.g. both arms at 0 wins at every seed)."""
        return self.sd > 1e-12 * max(1.0, abs(self.mean))


NO_SPREAD = "n/a (no spread over seeds)"  # the interval's and δ's cells where :attr:`SeedInterval.spread` is False
ONE_SEED = "n/a (one seed)"  # the same cells without an interval over seeds


def seed_cells(seeds: SeedInterval | None, number: str = "+.3f", detectable: str = ".3f") -> list[str]:
    """A report row's two cells over seeds: the t-interval (its ends formatted by ``number``) and the smallest
    detectable difference (by ``detectable``); :data:`ONE_SEED` without an interval (``None``), :data:`NO_SPREAD`
    where every seed's difference is the same."""
    if seeds is None:
        return [ONE_SEED] * 2
    if not seeds.spread:
        return [NO_SPREAD] * 2
    return [format_interval(seeds.low, seeds.high, number), f"{seeds.detectable:{detectable}}"]


def seed_interval(differences: Sequence[float], level: float = LEVEL, power: float = POWER) -> SeedInterval:
    """:class:`SeedInterval` of per-seed paired differences ``d_s`` (at least 2 seeds)."""
    if len(differences) < 2:
        raise ValueError(f"an interval over seeds needs at least 2 seeds, got {len(differences)}")
    df = len(differences) - 1
    mean, sd = statistics.fmean(differences), statistics.stdev(differences)
    se = sd / math.sqrt(len(differences))
    half = t_quantile((1 + level) / 2, df) * se
    return SeedInterval(tuple(differences), mean, sd, mean - half, mean + half,
                        detectable_noncentrality(df, level, power) * se)


Pair = tuple[bool, bool]  # one task's outcome (won) in the arm and in the other arm, the same seed


@dataclass(frozen=True)
class Contrast:
    """One ``arm - other`` comparison: the per-seed ``differences``, their interval over seeds (:class:`SeedInterval`;
    None from one seed: no spread to estimate, as in a pilot), and the pooled difference's interval from evaluation
    noise only (Newcombe's, ``paired``: per task, from the episodes; else the rates as independent)."""

    differences: tuple[float, ...]
    seeds: SeedInterval | None
    evaluation_noise: tuple[float, float]
    paired: bool
    episodes: int  # pooled over seeds: pairs (paired), else the arm's episodes


def _over_seeds(differences: Sequence[float]) -> SeedInterval | None:
    return seed_interval(differences) if len(differences) > 1 else None


def contrast_from_pairs(pairs: Sequence[Sequence[Pair]]) -> Contrast:
    """The contrast from each seed's episodes paired per task, ``pairs[s][i] = (arm won, other won)``:
    ``d_s = 1/n_s Σ_i (arm_i - other_i)``, and Newcombe's paired interval over the pooled 2x2 table."""
    differences = [sum(a - b for a, b in seed) / len(seed) for seed in pairs]
    flat = [pair for seed in pairs for pair in seed]
    table = [sum(1 for a, b in flat if (a, b) == cell) for cell in ((True, True), (True, False), (False, True))]
    return Contrast(tuple(differences), _over_seeds(differences),
                    newcombe_paired_interval(*table, len(flat) - sum(table)), True, len(flat))


def contrast_from_rates(arm: Sequence[tuple[int, int]], other: Sequence[tuple[int, int]]) -> Contrast:
    """The contrast from each seed's ``(wins, episodes)`` per arm (runs without per-episode records):
    ``d_s = wins_arm / n_arm - wins_other / n_other``, and Newcombe's interval of the pooled rates as independent (the
    evaluations' correlation through shared tasks unknown, so wider than a paired one)."""
    differences = [a / n_a - b / n_b for (a, n_a), (b, n_b) in zip(arm, other, strict=True)]
    pooled = [(sum(w for w, _ in runs), sum(n for _, n in runs)) for runs in (arm, other)]
    return Contrast(tuple(differences), _over_seeds(differences), newcombe_interval(*pooled[0], *pooled[1]), False,
                    pooled[0][1])


def format_interval(low: float, high: float, number: str = "+.3f") -> str:
    return f"[{low:{number}}, {high:{number}}]"


def describe(contrast: Contrast) -> list[str]:
    """The contrast in three lines (what the command line prints)."""
    seeds, count = contrast.seeds, len(contrast.differences)
    noise = "per task, paired" if contrast.paired else "the rates as independent"
    over = ("over seeds: one seed, no interval" if seeds is None else
            f"over seeds ({count}): {seeds.mean:+.3f}, {NO_SPREAD}" if not seeds.spread else
            f"over seeds ({count}, t with {count - 1} df): {seeds.mean:+.3f} {format_interval(seeds.low, seeds.high)}, "
            f"sd {seeds.sd:.3f}; smallest difference detectable at {POWER * 100:.0f} % power: {seeds.detectable:.3f}")
    return [f"per seed: {' '.join(f'{d:+.3f}' for d in contrast.differences)}", over,
            f"evaluation noise only ({contrast.episodes} episodes pooled, Newcombe, {noise}): "
            f"{format_interval(*contrast.evaluation_noise)}"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lightning_epo.reports.paired",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--arm", type=int, nargs="+", required=True, help="the arm's wins, one per seed")
    parser.add_argument("--other", type=int, nargs="+", required=True, help="the other arm's wins, the same seeds")
    parser.add_argument("--episodes", type=int, nargs="+", required=True,
                        help="episodes of each evaluation: one for all seeds, or one per seed")
    args = parser.parse_args(argv)
    seeds = len(args.arm)
    episodes = args.episodes * seeds if len(args.episodes) == 1 else args.episodes
    if len(args.other) != seeds or len(episodes) != seeds or seeds < 2:
        parser.error("need --arm and --other with one count per seed (at least 2), --episodes one or one per seed")
    if any(not 0 <= w <= n or n < 1 for wins in (args.arm, args.other) for w, n in zip(wins, episodes)):
        parser.error("need 0 <= wins <= episodes and episodes >= 1")
    for line in describe(contrast_from_rates(list(zip(args.arm, episodes)), list(zip(args.other, episodes)))):
        print(line)


if __name__ == "__main__":
    main()
