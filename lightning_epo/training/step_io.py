"""The typed hand-offs of one RL step between the LightningModule and its callbacks.

Before RL step k (the module's ``rl_step``) the callbacks fill the module's :class:`StepInputs`: β_k (Eq. 7) from
``BetaSchedule`` and H̄ (Eq. 5's window mean) from ``EntropyWindow``. After the step the module publishes a
:class:`StepReport`, read by the callbacks that keep state (the entropy window) or write reports (samples, entropy
by turn index).
"""

from __future__ import annotations

from dataclasses import dataclass

from lightning_epo.rollout.batch import RolloutBatch


@dataclass
class StepInputs:
    """What the callbacks hand the module before RL step k; None where no callback set it."""

    beta: float | None = None  # β_k (Eq. 7)
    entropy_ref: float | None = None  # H̄: the mean of the entropy window (None while it is empty, k = 0)
    window_len: int | None = None  # how many past steps H̄ averages (0 at k = 0)


@dataclass(frozen=True)
class StepReport:
    """What the module publishes after RL step k.

    entropy_mean: the mean old-policy token entropy over the response tokens of all ranks (the window's entry).
    turn_entropy: the mean old-policy token entropy of each turn index over all ranks (NaN: no token there).
    rollout: this rank's batch of the step (its episodes).
    """

    rl_step: int
    entropy_mean: float
    turn_entropy: list[float]
    rollout: RolloutBatch
