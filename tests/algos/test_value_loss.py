"""The critic's loss with the shipped PPO settings, and its explained-variance metric."""

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from lightning_epo.algos import clipped_value_loss
from lightning_epo.algos.losses import critic_means_from_moments, explained_variance, explained_variance_moments

PPO = OmegaConf.load(Path(__file__).parents[2] / "conf" / "algo" / "ppo.yaml")


def test_shipped_value_loss_lets_the_critic_reach_a_return_of_ten_in_one_rl_step():
    """V_old = 0, R = 10: one RL step's optimizer steps move V past the 0.2 an absolute clip would freeze it at."""
    value = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([value], lr=0.01)  # no momentum: a zero gradient is a frozen value
    for _ in range(8):  # e.g. 2 PPO epochs x 4 mini-batches on the same old values
        opt.zero_grad()
        clipped_value_loss(value, torch.zeros(1), torch.full((1,), 10.0), PPO.value_clip).sum().backward()
        opt.step()
    assert value.item() > 0.5


def test_an_absolute_clip_freezes_the_critic_beyond_it():
    value = torch.full((1,), 0.3, requires_grad=True)
    clipped_value_loss(value, torch.zeros(1), torch.full((1,), 10.0), 0.2).sum().backward()
    assert value.grad.item() == 0.0  # the clipped branch has no gradient path: an exact 0


def test_explained_variance_over_response_tokens():
    returns = torch.tensor([[0.0, 1.0, 2.0, 3.0], [9.0, 4.0, 5.0, 6.0]])
    mask = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 1]], dtype=torch.bool)  # column 0 is prompt: never read
    assert explained_variance(returns, returns, mask).item() == pytest.approx(1.0)
    assert explained_variance(returns, torch.full_like(returns, 7.0), mask).item() == pytest.approx(0.0, abs=1e-6)
    noisy = returns + torch.tensor([[0.0, 1.0, -1.0, 0.0], [0.0, 0.0, 1.0, -1.0]])
    r, e = returns[mask], (returns - noisy)[mask]
    expected = 1 - e.var(unbiased=False) / r.var(unbiased=False)
    assert explained_variance(returns, noisy, mask).item() == pytest.approx(expected.item(), rel=1e-5)


def test_explained_variance_sums_moments_over_ranks():
    returns, values = torch.randn(4, 6), torch.randn(4, 6)
    mask = torch.rand(4, 6) > 0.3
    whole = explained_variance(returns, values, mask)
    other_rank: list[torch.Tensor] = []
    explained_variance(returns[2:], values[2:], mask[2:], reduce=lambda m: other_rank.append(m) or m)
    summed = explained_variance(returns[:2], values[:2], mask[:2], reduce=lambda m: m + other_rank[0])
    assert summed.item() == pytest.approx(whole.item(), rel=1e-5)


def test_explained_variance_is_undefined_when_the_returns_do_not_vary():
    """Every episode of a step won alike: Var(R) is 0 up to rounding, so there is no ratio to report (it is not
    logged), rather than a huge negative number from the rounding error of the moments."""
    returns = torch.full((4, 7), 9.9)
    mask = torch.ones(4, 7, dtype=torch.bool)
    assert torch.isnan(explained_variance(returns, torch.randn(4, 7), mask))


def test_the_critics_means_are_the_masked_means_of_the_returns_and_values_over_ranks():
    """``critic/return_mean`` and ``critic/value_mean``: whether V is on the returns' scale, which the explained
    variance cannot say (it is 0 for a constant V at any level)."""
    returns, values = torch.randn(4, 6) * 5 + 7, torch.randn(4, 6)
    mask = torch.rand(4, 6) > 0.3
    mask[0, 0] = True
    ranks = explained_variance_moments(returns[:2], values[:2], mask[:2]) + explained_variance_moments(
        returns[2:], values[2:], mask[2:])
    return_mean, value_mean = critic_means_from_moments(ranks)
    assert return_mean == pytest.approx(returns[mask].mean().item(), rel=1e-5)
    assert value_mean == pytest.approx(values[mask].mean().item(), rel=1e-5, abs=1e-6)
