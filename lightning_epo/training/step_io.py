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

    def required(self, smoothing: bool, algo_name: str) -> "StepInputs":
        """These inputs, where an algorithm that ``smoothing`` (Eq. 6) has them from both callbacks; else the error
        (train.py refuses such a run at start: this guards a module driven by other code)."""
        if smoothing and (self.beta is None or self.window_len is None):
            raise RuntimeError(f"algo {algo_name} smooths entropy (Eq. 6) but no entropy window / beta_k schedule ran: "
                               "use callbacks=default (EntropyWindow and BetaSchedule)")
        return self


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
