"""Per-token PPO losses (Eq. 3), the clipped value loss and KL estimators; aggregation happens
elsewhere (:mod:`lightning_epo.algos.aggregation`)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from lightning_epo.algos.registry import Registry

POLICY_LOSSES: Registry = Registry("policy loss")
KL_ESTIMATORS: Registry = Registry("KL estimator")
LOSSES_WITHOUT_OLD_LOGPROBS = frozenset({"nll"})  # policy losses that read no old log-probs: no old-policy pass


@POLICY_LOSSES.register("clipped")
def clipped_policy_loss(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 3's clipped surrogate, negated per token (``L_MT`` before aggregation):
    ``-min(r A, clip(r, 1 - clip_low, 1 + clip_high) A)`` with ``r = exp(logprob - old_logprob)``.
    ``dual_clip = c > 1`` also bounds the loss of negative-advantage tokens by ``-c A`` (Ye et al. 2020).

    All inputs ``[...]`` (usually ``[N, L]``). Returns ``(loss [...], clipped [...] bool)`` where
    ``clipped`` marks tokens whose clipped term was the active one (``ppo/clipfrac``).
    """
    ratio = torch.exp(logprob - old_logprob)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    if dual_clip is not None:
        loss = torch.where(advantages < 0, torch.minimum(loss, -advantages * dual_clip), loss)
    return loss, (clipped > unclipped).detach()


@POLICY_LOSSES.register("nll")
def nll_policy_loss(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Supervised fine-tuning as a policy loss (``algo=sft``, a warm start on expert episodes):
    ``-log pi(token)`` per token; advantages and clipping play no part. Shapes as
    :func:`clipped_policy_loss`; ``clipped`` is all False."""
    return -logprob, torch.zeros_like(logprob, dtype=torch.bool)


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float | None = 0.2
) -> torch.Tensor:
    """PPO critic loss per token: ``0.5 * max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2)``;
    ``clip=None`` gives plain ``0.5 (V - R)^2``. Shapes ``[...]``."""
    err = (values - returns) ** 2
    if clip is None:
        return 0.5 * err
    clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    return 0.5 * torch.maximum(err, (clipped - returns) ** 2)


@KL_ESTIMATORS.register("k2")
def kl_k2(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimate ``0.5 * d^2`` with ``d = log pi - log pi_ref`` (Schulman's k2, the
    "k2 loss" of GRPO-style code): on tokens sampled from pi its expected gradient ``E_pi[d grad log pi]``
    is exactly ``grad KL(pi || pi_ref)``. (k1, ``d`` itself, is not offered: in a loss its expected gradient
    ``E_pi[grad log pi]`` is zero.) ``[...]``."""
    return 0.5 * (logprob - ref_logprob) ** 2


@KL_ESTIMATORS.register("k3")
def kl_k3(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimate ``exp(d) - d - 1`` with ``d = log pi_ref - log pi``
    (Schulman's k3: non-negative, low variance), clamped as verl's ``low_var_kl``: ``d`` to [-20, 20]
    before ``exp`` and the estimate to [-10, 10], so a token pi has all but left (``log pi = -95``)
    gives 10, not inf; clamped tokens pass no gradient. ``[...]``."""
    d = torch.clamp(ref_logprob - logprob, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(d) - d - 1.0, min=-10.0, max=10.0)


def approx_kl(logprob: torch.Tensor, old_logprob: torch.Tensor) -> torch.Tensor:
    """``ppo/approx_kl`` per token: k3 of the old policy against the new, ``(r - 1) - log r``. ``[...]``."""
    log_ratio = logprob - old_logprob
    return torch.exp(log_ratio) - 1.0 - log_ratio


def past_target_kl(kl_and_weight: torch.Tensor, target_kl: float) -> bool:
    """Stable-Baselines3's early stop of a PPO update: whether a mini-batch's :func:`approx_kl`, given as its weighted
    sum and its total weight ``[2]`` (over all ranks), exceeds ``1.5 * target_kl``."""
    kl, weight = kl_and_weight.tolist()
    return weight > 0 and kl / weight > 1.5 * target_kl


def explained_variance(
    returns: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, reduce: Callable[[torch.Tensor], torch.Tensor] | None = None
) -> torch.Tensor:
    """``critic/explained_variance``: ``1 - Var(R - V) / Var(R)`` over response tokens (1: the critic predicts the
    returns, 0: no better than their mean, < 0: worse).

    ``returns``, ``values`` and ``mask`` are ``[N, L]``; ``reduce`` sums the ``[5]`` vector of moments over ranks
    (identity if None). Returns a 0-d float32 tensor, NaN when the returns do not vary: ``Var(R)`` within float32
    rounding of ``E[R^2]`` (e.g. every episode of the step won alike), where the ratio would be rounding noise.
    """
    moments = explained_variance_moments(returns, values, mask)
    return explained_variance_from_moments(reduce(moments) if reduce is not None else moments)


def explained_variance_moments(returns: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The ``[5]`` sums :func:`explained_variance` needs (of R, R², R − V, (R − V)², the token count) over the
    response tokens of ``[N, L]`` inputs: summed over ranks, they give the all-rank value."""
    mask = mask.bool()
    r, err = returns[mask].float(), (returns - values)[mask].float()
    return torch.stack([r.sum(), (r**2).sum(), err.sum(), (err**2).sum(), mask.sum().float()])


def critic_means_from_moments(moments: torch.Tensor) -> tuple[float, float]:
    """``critic/return_mean`` and ``critic/value_mean``: the mean return target ``R`` and the mean value ``V`` over
    response tokens, from :func:`explained_variance_moments` ``[5]`` (``V = R - (R - V)``). Whether the critic is on
    the returns' scale, which the explained variance cannot say: it is 0 for a constant ``V`` at any level."""
    n = moments[4].clamp(min=1.0)
    return float(moments[0] / n), float((moments[0] - moments[2]) / n)


def explained_variance_from_moments(moments: torch.Tensor) -> torch.Tensor:
    """``1 - Var(R - V) / Var(R)`` from :func:`explained_variance_moments` ``[5]``; NaN when the returns do not vary
    (see :func:`explained_variance`)."""
    n = moments[4].clamp(min=1.0)
    var_r = moments[1] / n - (moments[0] / n) ** 2
    var_err = moments[3] / n - (moments[2] / n) ** 2
    if var_r <= 1e-5 * moments[1] / n:  # float32 moments carry ~1e-7 relative error, times the token count
        return torch.full((), float("nan"))
    return 1.0 - var_err / var_r
