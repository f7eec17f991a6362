"""The EPO objective of Appendix C on one micro-batch:
``loss = pg_loss - lambda * (entropy_loss - beta_k * smoothing_loss) + value and KL terms``.

Every term is a weighted sum over tokens with weights fixed once per RL step
(:mod:`lightning_epo.algos.aggregation`), so micro-batches add up to the full-batch value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch

from lightning_epo.algos.aggregation import weighted_sum
from lightning_epo.algos.entropy import PENALTIES
from lightning_epo.algos.losses import KL_ESTIMATORS, POLICY_LOSSES, approx_kl, clipped_value_loss


@dataclass
class StepTargets:
    """Fixed for a whole RL step (computed in the old-policy pass), sliced per micro-batch; all ``[n, L]``.

    pg_weights: the ``algo.loss_agg`` weights (Eq. 4's, the flat token mean or Dr. GRPO's), for L_MT, value, KL.
    traj_weights: Eq. 4 weights, always, for L_H and L_smooth (Eq. 6).
    mean_weights: weights summing to 1 over the step, for the diagnostics ``clipfrac`` and ``approx_kl``:
        ``pg_weights``, or the flat token mean where those do not sum to 1 (``loss_agg=seq_sum_norm``).
    """

    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    pg_weights: torch.Tensor
    traj_weights: torch.Tensor
    mean_weights: torch.Tensor
    returns: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None

    def select(self, rows: torch.Tensor, length: int) -> "StepTargets":
        """The micro-batch ``rows`` of every ``[N, L]`` target, trimmed to its first ``length`` columns."""
        return StepTargets(
            **{name: None if (x := getattr(self, name)) is None else x[rows, :length] for name in self.__dataclass_fields__}
        )


@dataclass
class ObjectiveSettings:
    """The per-RL-step constants of the objective: ``lambda_k`` (entropy_coef), ``beta_k`` and ``Hbar``
    (``entropy_ref``; None while the history window is empty or without smoothing)."""

    entropy_coef: float
    beta: float
    entropy_ref: float | None
    smoothing: bool
    kappa_l: float = 0.0
    kappa_r: float = 2.0
    alpha: float = 0.05
    penalty: str = "hinge"
    policy_loss: str = "clipped"
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    value_coef: float = 0.5
    value_clip: float | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"

    @classmethod
    def from_algo(cls, algo: Mapping[str, Any]) -> "ObjectiveSettings":
        """The run's fixed settings, each read by its own name from ``algo.epo`` (Eq. 5-6's ``kappa_l``, ``kappa_r``,
        ``alpha``, ``penalty``) or else from ``algo`` (fields of :mod:`lightning_epo.algos.settings`, same names and
        types); smoothing (Eq. 6) is ``algo.epo.smoothing``. λ_k, β_k and H̄ change every RL step: they start at
        0 / None here."""
        epo = algo["epo"]
        per_step = {"entropy_coef": 0.0, "beta": 0.0, "entropy_ref": None, "smoothing": bool(epo["smoothing"])}
        fixed = {f.name: epo[f.name] if f.name in epo else algo[f.name] for f in fields(cls) if f.name not in per_step}
        return cls(**per_step, **fixed)


def epo_objective(
    logprob: torch.Tensor,
    entropy: torch.Tensor,
    values: torch.Tensor | None,
    targets: StepTargets,
    s: ObjectiveSettings,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss of one micro-batch and its terms (each a weighted sum, so summing micro-batches gives the batch value).

    Args:
        logprob, entropy: ``[n, L]`` current-policy log-probs and token entropies on response tokens.
        values: ``[n, L]`` current critic values, or None without a critic.
    Returns:
        ``loss`` (scalar) and a dict with ``policy`` (L_MT), ``entropy`` (L_H), ``smooth`` (L_smooth, only
        when ``Hbar`` exists), ``value``, ``kl`` (when present), ``total``, ``clipfrac``, ``approx_kl``.
    """
    pg_tok, clipped = POLICY_LOSSES.get(s.policy_loss)(
        logprob, targets.old_logprobs, targets.advantages, s.clip_low, s.clip_high, s.dual_clip
    )
    terms = {
        "policy": weighted_sum(pg_tok, targets.pg_weights),
        "entropy": weighted_sum(entropy, targets.traj_weights),
        "clipfrac": weighted_sum(clipped.float(), targets.mean_weights),
        "approx_kl": weighted_sum(approx_kl(logprob, targets.old_logprobs).detach(), targets.mean_weights),
    }
    regulariser = terms["entropy"]
    if s.smoothing and s.entropy_ref is not None:
        penalty = PENALTIES.get(s.penalty)(entropy, s.entropy_ref, s.kappa_l, s.kappa_r, s.alpha)
        terms["smooth"] = weighted_sum(penalty, targets.traj_weights)
        regulariser = regulariser - s.beta * terms["smooth"]
    loss = terms["policy"]
    if s.entropy_coef != 0.0:  # plain PPO/GRPO: entropy is a metric only, no backward through it
        loss = loss - s.entropy_coef * regulariser
    if values is not None:
        terms["value"] = weighted_sum(
            clipped_value_loss(values, targets.old_values, targets.returns, s.value_clip), targets.pg_weights
        )
        loss = loss + s.value_coef * terms["value"]
    if targets.ref_logprobs is not None:
        terms["kl"] = weighted_sum(KL_ESTIMATORS.get(s.kl_estimator)(logprob, targets.ref_logprobs), targets.pg_weights)
        loss = loss + s.kl_coef * terms["kl"]
    terms["total"] = loss
    return loss, {k: v.detach() for k, v in terms.items()}
