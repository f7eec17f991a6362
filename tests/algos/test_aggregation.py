import pytest
import torch

from lightning_epo.algos import (
    sequence_sum_weights,
    token_mean_weights,
    trajectory_mean,
    trajectory_weights,
    weighted_sum,
)


def rows(lengths, width=8):
    mask = torch.zeros(len(lengths), width, dtype=torch.bool)
    for r, n in enumerate(lengths):
        mask[r, 2 : 2 + n] = True  # two prompt tokens, then n response tokens
    return mask


def test_trajectories_count_equally_whatever_their_number_of_turns():
    # trajectory 0: one turn of value 1; trajectory 1: three turns of value 3
    mask = rows([2, 2, 2, 2])
    traj = torch.tensor([0, 1, 1, 1])
    values = torch.tensor([1.0, 3.0, 3.0, 3.0])[:, None].expand(4, 8)
    assert trajectory_mean(values, mask, traj).item() == pytest.approx((1.0 + 3.0) / 2)
    # a flat token mean would weigh trajectory 1 three times as much
    assert weighted_sum(values, token_mean_weights(mask)).item() == pytest.approx(2.5)


def test_turns_count_equally_whatever_their_lengths():
    mask = rows([1, 5])
    traj = torch.tensor([7, 7])
    values = torch.tensor([2.0, 4.0])[:, None].expand(2, 8)
    assert trajectory_mean(values, mask, traj).item() == pytest.approx(3.0)


def test_matches_a_loop_over_eq4():
    torch.manual_seed(0)
    lengths = [3, 1, 4, 2, 5, 2]
    mask = rows(lengths, width=10)
    traj = torch.tensor([3, 3, 9, 1, 1, 1])
    values = torch.randn(6, 10)
    expected = 0.0
    trajs = traj.unique().tolist()
    for j in trajs:
        turns = [r for r in range(6) if traj[r] == j]
        expected += sum(values[r][mask[r]].mean() for r in turns) / len(turns)
    expected /= len(trajs)
    assert trajectory_mean(values, mask, traj).item() == pytest.approx(float(expected), rel=1e-6)
    assert trajectory_mean(values, mask.float(), traj).item() == pytest.approx(float(expected), rel=1e-6)


def test_weights_sum_to_one_and_split_across_pieces():
    mask = rows([3, 1, 4, 2])
    traj = torch.tensor([0, 0, 1, 2])
    w = trajectory_weights(mask, traj)
    assert w.sum().item() == pytest.approx(1.0)
    values = torch.randn(4, 8)
    whole = weighted_sum(values, w)
    pieces = weighted_sum(values[:2], w[:2]) + weighted_sum(values[2:], w[2:])
    assert torch.allclose(whole, pieces)
    # B over all ranks: with twice the trajectories elsewhere, these weights halve
    assert trajectory_weights(mask, traj, num_trajectories=6).sum().item() == pytest.approx(0.5)


def test_environment_positions_never_contribute_even_if_not_finite():
    mask = rows([2, 3])
    traj = torch.tensor([0, 1])
    values = torch.ones(2, 8)
    planted = values.clone()
    planted[~mask] = float("inf")
    # identity is the point: masked entries are selected away before the sum; and every float32 summation order of
    # the weights (1/4, 1/4, 1/6, 1/6, 1/6) gives exactly 1.0, so this holds on any CPU
    assert trajectory_mean(planted, mask, traj).item() == trajectory_mean(values, mask, traj).item() == 1.0


def test_rows_without_response_tokens_do_not_count_as_turns():
    mask = rows([2, 0])
    traj = torch.tensor([0, 0])
    values = torch.full((2, 8), 5.0)
    assert trajectory_mean(values, mask, traj).item() == pytest.approx(5.0)


def test_sequence_sum_weights_are_dr_grpos_token_sum_over_a_constant():
    """Each turn's token sum divided by C, then the mean over turns holding response tokens: a loop over verl's
    seq-mean-token-sum-norm. A turn's tokens are not divided by its own length, so a long turn weighs more."""
    torch.manual_seed(0)
    mask = rows([3, 1, 0, 5], width=10)
    values = torch.randn(4, 10)
    expected = sum(values[r][mask[r]].sum() / 16 for r in (0, 1, 3)) / 3
    w = sequence_sum_weights(mask, scale=16)
    assert weighted_sum(values, w).item() == pytest.approx(float(expected), rel=1e-6)
    assert torch.equal(w[mask], torch.full((9,), 1 / (3 * 16))) and (w[~mask] == 0).all()  # one division: exact
    # pieces add up to the whole; the all-rank number of turns replaces the local one
    assert torch.allclose(weighted_sum(values[:2], w[:2]) + weighted_sum(values[2:], w[2:]), weighted_sum(values, w))
    assert torch.equal(sequence_sum_weights(mask, scale=16, num_sequences=6), w / 2)  # halving is exact in float32
