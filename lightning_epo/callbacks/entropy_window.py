"""The history window W_k of per-step batch-mean token entropies, whose mean is Eq. 5's Hbar."""

from __future__ import annotations

from typing import Any

import lightning as L


class EntropyWindow(L.Callback):
    """Keeps ``W_k``: one entry per completed RL step, the flat mean of that step's old-policy token
    entropies over all ranks (the module's step report).

    Before step k it hands ``Hbar = mean(W_k)`` to the module (None while the window is empty, k = 0);
    ``window='cumulative'`` (the paper) averages every past step, an int ``n`` the last ``n``.
    Saved in the checkpoint, so a resumed run continues with the same window.
    """

    def __init__(self, window: str | int = "cumulative") -> None:
        self.window = window
        self.values: list[float] = []

    @property
    def state_key(self) -> str:
        return self._generate_state_key(window=self.window)

    def recent(self) -> list[float]:
        """The entries H̄ averages: all of them, or the last ``window``."""
        return self.values if self.window == "cumulative" else self.values[-self.window :]

    def entropy_ref(self) -> float | None:
        """H̄ = mean(W_k), None while the window is empty."""
        recent = self.recent()
        return sum(recent) / len(recent) if recent else None

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        pl_module.step_inputs.entropy_ref, pl_module.step_inputs.window_len = self.entropy_ref(), len(self.recent())

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.values.append(pl_module.step_report.entropy_mean)

    def state_dict(self) -> dict[str, Any]:
        return {"values": list(self.values)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.values = list(state_dict["values"])
