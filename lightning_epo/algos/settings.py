"""The algorithm's settings, typed: the ``algo`` node of every conf/algo/*.yaml is an :class:`AlgoConfig`.

The YAML files hold the values and say what each does; these dataclasses hold each key's type and the rule that
checks it at start (:func:`lightning_epo.core.rules.rules_of` reads them into ``runtime/config.py``'s ``RULES``).
``runtime/config.py`` merges the composed ``algo`` into :class:`AlgoConfig` (OmegaConf's structured configs): a
key that is not here is refused, and the run reads typed values. :class:`~lightning_epo.algos.objective.
ObjectiveSettings` reads its run-fixed fields from them by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from lightning_epo.algos.advantages import ADVANTAGES
from lightning_epo.algos.entropy import PENALTIES
from lightning_epo.algos.losses import KL_ESTIMATORS, POLICY_LOSSES
from lightning_epo.core.rules import (
    FRACTION,
    NON_NEGATIVE,
    POSITIVE,
    SWITCH,
    checked,
    integer,
    number,
    one_of,
    registered,
)


@dataclass
class GaeConfig:
    """GAE (``algo.advantage=gae``): γ and λ act once per ``unit``, an environment step or a token."""

    gamma: float = checked(FRACTION)
    lam: float = checked(FRACTION)
    unit: str = checked(one_of("turn", "token"))


@dataclass
class GrpoConfig:
    """GRPO's group normalisation: ``(R - mean) / (std + eps)``, or ``R - mean`` without ``norm_by_std``."""

    eps: float = checked(POSITIVE)
    norm_by_std: bool = checked(SWITCH)


@dataclass
class GigpoConfig(GrpoConfig):
    """GiGPO's episode and step advantages, ``A = A^E + step_weight * A^S`` (conf/algo/gigpo.yaml), each level
    normalised as GRPO's; ``gamma`` discounts the step return."""

    gamma: float = checked(FRACTION)
    step_weight: float = checked(NON_NEGATIVE)


@dataclass
class ShapingConfig:
    """The entropy-shaped advantage (ppo_ea): ``A + min(alpha * H, |A| / kappa)``."""

    alpha: float = checked(NON_NEGATIVE)
    kappa: float = checked(POSITIVE)


@dataclass
class EpoConfig:
    """EPO's settings: Eq. 5's range ``[kappa_l, kappa_r] * H̄`` and ``alpha``, Eq. 6's smoothing and penalty, Eq. 7's
    β schedule, the entropy window. ``beta`` (``schedule`` or a number) and ``window`` (``cumulative`` or a size)
    take a name or a number: runtime/config.py checks them."""

    smoothing: bool = checked(SWITCH)
    kappa_l: float = checked(NON_NEGATIVE)
    kappa_r: float = checked(POSITIVE)
    alpha: float = checked(NON_NEGATIVE)
    penalty: str = checked(registered(PENALTIES))
    beta: Any = MISSING
    beta_start: float = checked(NON_NEGATIVE)
    beta_end: float = checked(NON_NEGATIVE)
    lambda_d: float = checked(POSITIVE)
    window: Any = MISSING


@dataclass
class AlgoConfig:
    """The ``algo`` node: the estimator, the PPO surrogate and its batches, the regularisers (entropy, KL, EPO)."""

    name: str = MISSING
    advantage: str = checked(registered(ADVANTAGES))
    gae: GaeConfig = field(default_factory=GaeConfig)
    grpo: GrpoConfig = field(default_factory=GrpoConfig)
    gigpo: GigpoConfig | None = None
    whiten_advantages: bool = checked(SWITCH)
    critic: bool = checked(SWITCH)
    group_size: int = checked(integer())
    policy_loss: str = checked(registered(POLICY_LOSSES))
    clip_low: float = checked(number(0, 1, open_low=True, open_high=True))
    clip_high: float = checked(POSITIVE)
    dual_clip: float | None = checked(number(1, open_low=True, optional=True, example=3.0))
    loss_agg: str = checked(one_of("trajectory", "token", "seq_sum_norm"))
    loss_scale_factor: int = checked(integer())
    value_coef: float = checked(NON_NEGATIVE)
    value_clip: float | None = checked(number(0, open_low=True, optional=True, example=10.0))
    entropy_coef: float = checked(NON_NEGATIVE)
    entropy_decay: str = checked(one_of("none", "linear", "cosine"))
    kl_coef: float = checked(NON_NEGATIVE)
    kl_estimator: str = checked(registered(KL_ESTIMATORS))
    advantage_shaping: ShapingConfig | None = None
    ppo_epochs: int = checked(integer())
    mini_batches: int = checked(integer())
    target_kl: float | None = checked(number(0, open_low=True, optional=True, example=0.02))
    micro_batch_tokens: int | None = checked(integer(optional=True))
    micro_batch_size: int | None = checked(integer(optional=True))
    batch_by_episode: bool = checked(SWITCH)
    epo: EpoConfig = field(default_factory=EpoConfig)
