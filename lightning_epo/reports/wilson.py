"""The 95 % Wilson score interval of a success rate over n episodes, which every success rate of the project's tables
carries, and Newcombe's intervals for the difference of two such rates (two arms' final evaluations, independent or
paired per task). Both are evaluation noise only: the policies held fixed, their episodes redrawn; the spread of
training over seeds is :mod:`lightning_epo.reports.paired`'s.

    python -m lightning_epo.reports.wilson SUCCESSES EPISODES     # e.g. 8 16 -> 50.0 [28.0, 72.0], n=16
    python -m lightning_epo.reports.wilson S1 N1 S2 N2            # e.g. 56 70 48 80 -> +0.200 [+0.052, +0.334]
"""

from __future__ import annotations

import argparse
import math

Z95 = 1.959963984540054  # the standard normal's 97.5 % quantile: a two-sided 95 % interval


def wilson_interval(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion ``p = successes / n`` (E. B. Wilson, "Probable inference,
    the law of succession, and statistical inference", JASA 22 (1927) 209-212):

        (p + z²/2n  ±  z sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)

    Unlike the normal (Wald) interval ``p ± z sqrt(p(1-p)/n)`` it stays inside [0, 1] and keeps its width at p = 0
    or 1, the small-n regime of 16-episode validation sets. Returns (low, high) as fractions."""
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n and n >= 1, got {successes} of {n}")
    p = successes / n
    centre = p + z * z / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    scale = 1 + z * z / n
    return max(0.0, (centre - half) / scale), min(1.0, (centre + half) / scale)


def newcombe_interval(successes_1: float, n_1: int, successes_2: float, n_2: int,
                      z: float = Z95) -> tuple[float, float]:
    """The interval of ``p1 - p2`` for two independent binomial proportions from their Wilson intervals
    ``(l1, u1)``, ``(l2, u2)`` (R. G. Newcombe, "Interval estimation for the difference between independent
    proportions", Statistics in Medicine 17 (1998) 873-890, method 10):

        (p1 - p2 - sqrt((p1 - l1)² + (u2 - p2)²),  p1 - p2 + sqrt((u1 - p1)² + (p2 - l2)²))

    Returns (low, high) as fractions."""
    return _square_and_add(successes_1 / n_1, wilson_interval(successes_1, n_1, z),
                           successes_2 / n_2, wilson_interval(successes_2, n_2, z))


def _square_and_add(p_1: float, interval_1: tuple[float, float], p_2: float, interval_2: tuple[float, float],
                    phi: float = 0.0) -> tuple[float, float]:
    """Newcombe's combination of two rates' intervals into one of ``p_1 - p_2`` (``phi``: their correlation)."""
    (low_1, high_1), (low_2, high_2) = interval_1, interval_2
    below = (p_1 - low_1) ** 2 - 2 * phi * (p_1 - low_1) * (high_2 - p_2) + (high_2 - p_2) ** 2
    above = (high_1 - p_1) ** 2 - 2 * phi * (high_1 - p_1) * (p_2 - low_2) + (p_2 - low_2) ** 2
    return p_1 - p_2 - math.sqrt(max(below, 0.0)), p_1 - p_2 + math.sqrt(max(above, 0.0))


def newcombe_paired_interval(both: int, first_only: int, second_only: int, neither: int,
                             z: float = Z95) -> tuple[float, float]:
    """The interval of ``p1 - p2`` for two proportions measured on the same n items (paired: the same tasks played by
    two arms), from the 2x2 table of the pairs, ``both`` + ``first_only`` + ``second_only`` + ``neither`` = n
    (R. G. Newcombe, "Improved confidence intervals for the difference between binomial proportions based on paired
    data", Statistics in Medicine 17 (1998) 2635-2650, method 10, as D. G. Altman et al., "Statistics with
    confidence", 2nd ed. (2000), p. 52, give it): with ``p1 = (both + first_only) / n``, ``p2 = (both + second_only) /
    n``, their Wilson intervals ``(l1, u1)``, ``(l2, u2)`` and the pairs' correlation, corrected towards 0,

        B = both·neither - first_only·second_only,   C = B if B <= 0, max(B - n/2, 0) if B > 0
        phi = C / sqrt((both + first_only)(second_only + neither)(both + second_only)(first_only + neither))

    (0 where a margin is empty),

        (p1 - p2 - sqrt((p1 - l1)² - 2 phi (p1 - l1)(u2 - p2) + (u2 - p2)²),
         p1 - p2 + sqrt((u1 - p1)² - 2 phi (u1 - p1)(p2 - l2) + (p2 - l2)²)).

    With phi = 0 it is :func:`newcombe_interval`; pairs that agree (phi > 0) narrow it. Returns (low, high) as
    fractions."""
    n = both + first_only + second_only + neither
    first, second = both + first_only, both + second_only
    margins = first * (second_only + neither) * second * (first_only + neither)
    agreement = both * neither - first_only * second_only
    corrected = agreement if agreement <= 0 else max(agreement - n / 2, 0.0)
    phi = corrected / math.sqrt(margins) if margins else 0.0
    return _square_and_add(first / n, wilson_interval(first, n, z), second / n, wilson_interval(second, n, z), phi)


def format_rate(successes: int, n: int) -> str:
    """``successes`` of ``n`` in percent with its 95 % interval and n: ``50.0 [28.0, 72.0], n=16``."""
    low, high = wilson_interval(successes, n)
    return f"{100 * successes / n:.1f} [{100 * low:.1f}, {100 * high:.1f}], n={n}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lightning_epo.reports.wilson",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("counts", type=int, nargs="+", metavar="SUCCESSES EPISODES",
                        help="one rate (SUCCESSES EPISODES), or two (S1 N1 S2 N2): the first minus the second")
    args = parser.parse_args(argv)
    pairs = list(zip(args.counts[::2], args.counts[1::2]))
    if len(args.counts) not in (2, 4) or any(not 0 <= s <= n or n < 1 for s, n in pairs):
        parser.error("need SUCCESSES EPISODES [SUCCESSES EPISODES], each 0 <= SUCCESSES <= EPISODES and EPISODES >= 1")
    if len(pairs) == 1:
        print(format_rate(*pairs[0]))
        return
    (s_1, n_1), (s_2, n_2) = pairs
    low, high = newcombe_interval(s_1, n_1, s_2, n_2)
    print(f"{s_1 / n_1 - s_2 / n_2:+.3f} [{low:+.3f}, {high:+.3f}]")


if __name__ == "__main__":
    main()
