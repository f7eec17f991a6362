"""The metrics of one RL step: each rank's sums gathered under names, reduced over ranks in one collective.

The metric names themselves are in :mod:`lightning_epo.core.metric_names`; :mod:`lightning_epo.training.step_log`
adds its sums here, reduces once, and the module logs the results without further synchronisation.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch


class RankSums:
    """Named per-rank sums (scalars or vectors), reduced over ranks together: every rank must add the same names
    with the same sizes in the same order."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.parts: dict[str, torch.Tensor] = {}

    def add(self, name: str, value: float | torch.Tensor) -> None:
        """Add this rank's ``value`` under ``name`` (flattened to float32)."""
        self.parts[name] = torch.as_tensor(value, dtype=torch.float32, device=self.device).detach().reshape(-1)

    def reduce(self, reduce: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, torch.Tensor]:
        """The all-rank sums by name: ``reduce`` (a sum over ranks) runs once on all of them."""
        total = reduce(torch.cat(list(self.parts.values())))
        return dict(zip(self.parts, total.split([part.numel() for part in self.parts.values()])))


def turn_entropy_sums(
    entropy: torch.Tensor, mask: torch.Tensor, turn_idx: torch.Tensor, max_turns: int
) -> torch.Tensor:
    """``[2, max_turns]``: the sum and count of response-token entropies per turn index, from ``entropy`` and
    ``mask`` ``[N, L]`` and the rows' ``turn_idx`` ``[N]`` (all below ``max_turns``)."""
    mask = mask.float()
    sums = torch.zeros(2, max_turns, device=entropy.device)
    sums[0].index_add_(0, turn_idx, (entropy * mask).sum(-1))
    sums[1].index_add_(0, turn_idx, mask.sum(-1))
    return sums


def sampler_gap_sums(
    sampler_logprobs: torch.Tensor | None, old_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """``[2]``: the sum and count of ``|sampler_logprobs - old_logprobs|`` over the response tokens ``mask``, all
    ``[N, L]``: how far the log-probs the engine sampled with are from the old policy's that Eq. 3's ratio divides by
    (0 with the same weights in the same arithmetic; a bf16 engine or a stale weight push shows here). ``[0, 0]``
    without engine log-probs (None: the expert's)."""
    if sampler_logprobs is None:
        return torch.zeros(2, device=old_logprobs.device)
    return torch.stack([(sampler_logprobs - old_logprobs).abs()[mask].sum(), mask.sum().float()])


def turn_means(sums: torch.Tensor) -> list[float]:
    """Mean entropy per turn index from :func:`turn_entropy_sums` (all ranks) ``[2, T]``: NaN where no token was,
    the turn indices after the last one any response reached left out."""
    means = [float(s / c) if c > 0 else math.nan for s, c in zip(sums[0], sums[1])]
    while means and math.isnan(means[-1]):
        means.pop()
    return means


def ratio(total: torch.Tensor) -> float | None:
    """``total[0] / total[1]`` of a (sum, count) pair, or None without a count (a metric with no tokens)."""
    return float(total[0] / total[1]) if total[1] > 0 else None
