"""One RL step's metrics: named per-rank sums reduced over ranks in one collective."""

from __future__ import annotations

import math

import torch

from lightning_epo.training.step_metrics import RankSums, ratio, turn_entropy_sums, turn_means


def test_every_sum_goes_through_one_reduction_and_comes_back_by_name():
    calls = []

    def two_ranks(flat: torch.Tensor) -> torch.Tensor:  # the other rank holds the same values
        calls.append(flat.clone())
        return flat * 2

    sums = RankSums(torch.device("cpu"))
    sums.add("train/reward", 1.5)
    sums.add("panels", torch.arange(8.0))
    sums.add("entropy", torch.tensor([3.0, 4.0]))
    total = sums.reduce(two_ranks)
    assert len(calls) == 1 and calls[0].numel() == 11
    assert list(total) == ["train/reward", "panels", "entropy"]
    # small integers and doubling are exact in float32 on any CPU: identity is the point (sums come back unchanged)
    assert float(total["train/reward"]) == 3.0 and torch.equal(total["panels"], torch.arange(8.0) * 2)
    assert ratio(total["entropy"]) == 0.75 and ratio(torch.tensor([1.0, 0.0])) is None


def test_turn_means_over_ranks_leave_out_turns_no_response_reached():
    entropy, mask = torch.tensor([[1.0, 3.0], [2.0, 0.0], [5.0, 5.0]]), torch.tensor([[1, 1], [1, 0], [0, 0]])
    sums = turn_entropy_sums(entropy, mask, torch.tensor([0, 2, 3]), max_turns=6)
    assert sums.shape == (2, 6)
    means = turn_means(sums)
    assert means[0] == 2.0 and math.isnan(means[1]) and means[2] == 2.0 and len(means) == 3  # turn 3: no token
