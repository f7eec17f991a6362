"""EPO math: pure torch, no Lightning. Equation numbers are the paper's."""

from lightning_epo.algos.advantages import ADVANTAGES, AdvantageInputs, entropy_shaped_advantage, whiten
from lightning_epo.algos.aggregation import (
    sequence_sum_weights,
    token_mean_weights,
    trajectory_mean,
    trajectory_weights,
    weighted_sum,
)
from lightning_epo.algos.entropy import PENALTIES, entropy_penalty, out_of_range, token_entropy, token_logprobs
from lightning_epo.algos.losses import KL_ESTIMATORS, POLICY_LOSSES, approx_kl, clipped_value_loss
from lightning_epo.algos.schedules import beta_schedule, entropy_coef_at

__all__ = [
    "ADVANTAGES",
    "AdvantageInputs",
    "KL_ESTIMATORS",
    "PENALTIES",
    "POLICY_LOSSES",
    "approx_kl",
    "beta_schedule",
    "clipped_value_loss",
    "entropy_coef_at",
    "entropy_penalty",
    "entropy_shaped_advantage",
    "out_of_range",
    "sequence_sum_weights",
    "token_entropy",
    "token_logprobs",
    "token_mean_weights",
    "trajectory_mean",
    "trajectory_weights",
    "weighted_sum",
    "whiten",
]
