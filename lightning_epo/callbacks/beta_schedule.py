"""beta_k (Eq. 7) over the RL step index, or a constant (the ``ppo_epo_const_beta`` ablation)."""

from __future__ import annotations

from typing import Any

import lightning as L

from lightning_epo.algos import beta_schedule


class BetaSchedule(L.Callback):
    """Hands ``beta_k`` to the module before RL step k (the module's ``rl_step``, restored on resume);
    ``beta='schedule'`` follows Eq. 7 with K = ``total_steps``, a number keeps beta constant."""

    def __init__(
        self, total_steps: int, beta: str | float = "schedule", beta_start: float = 2.0, beta_end: float = 1.0, lambda_d: float = 3.0
    ) -> None:
        self.total_steps, self.beta = total_steps, beta
        self.beta_start, self.beta_end, self.lambda_d = beta_start, beta_end, lambda_d

    @property
    def state_key(self) -> str:
        return self._generate_state_key(beta=self.beta)

    def beta_at(self, k: int) -> float:
        """β_k: Eq. 7 at step k, or the constant."""
        if self.beta == "schedule":
            return beta_schedule(k, self.total_steps, self.beta_start, self.beta_end, self.lambda_d)
        return float(self.beta)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        pl_module.step_inputs.beta = self.beta_at(pl_module.rl_step)
