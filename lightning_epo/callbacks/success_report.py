"""Validation success on the console: one line per evaluation, and the run's learning in two numbers per split (success
at the first and at the last evaluation of this process; with ``val_at_start=true``: before the first RL step and
after the last), which the run prints last (lightning_epo/runtime/console.py)."""

from __future__ import annotations

import logging

import lightning as L

log = logging.getLogger(__name__)


class SuccessReport(L.Callback):
    """Records ``val/<split>/success`` at every evaluation and logs it (rank 0) in one line:
    ``evaluation at RL step 10: val/iid/success 0.78, val/ood/success 0.31``. :meth:`lines` gives the end-of-run
    report, one line per split: ``val/iid/success 0.41 at RL step 0 -> 0.62 at RL step 20``. Every evaluation of a
    split plays the same tasks (``env.val_size`` episodes drawn once for the seed), so the numbers are comparable."""

    def __init__(self) -> None:
        self.history: dict[str, list[tuple[int, float]]] = {}

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        measured = {name: float(value) for name, value in sorted(trainer.callback_metrics.items())
                    if name.startswith("val/") and name.endswith("/success")}
        for name, value in measured.items():
            self.history.setdefault(name, []).append((pl_module.rl_step, value))
        if trainer.is_global_zero:
            results = ", ".join(f"{name} {value:.2f}" for name, value in measured.items())
            log.info("evaluation at RL step %d: %s", pl_module.rl_step, results)

    def lines(self) -> list[str]:
        """One line per split evaluated at least twice."""
        return [
            f"{name} {first:.2f} at RL step {first_step} -> {last:.2f} at RL step {last_step}"
            for name, points in sorted(self.history.items()) if len(points) > 1
            for (first_step, first), (last_step, last) in [(points[0], points[-1])]
        ]
