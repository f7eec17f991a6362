"""What stops a diverged run before its RL step is checkpointed, so that the last checkpoint stays the last good
state: a streak of skipped optimizer steps, non-finite old-policy outputs, and parameter norms that are not finite
or grew too much in one update. Each check returns why the run must stop (None: it goes on); the module raises
:func:`diverged_error`, which names the checkpoint to resume from.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from lightning_epo.core.errors import TrainingDiverged
from lightning_epo.models.shards import local_values
from lightning_epo.training.checkpoint_io import newest_checkpoint


class DivergenceGuard:
    """The run's count of skipped optimizer steps (a loss or gradient norm that was not finite) and the limits
    ``optim.max_skipped_streak`` and ``optim.max_param_norm_growth`` (null: no limit)."""

    def __init__(self, max_skipped_streak: int | None, max_param_norm_growth: float | None) -> None:
        self.max_skipped_streak, self.max_param_norm_growth = max_skipped_streak, max_param_norm_growth
        self.skipped_steps = 0
        self.skip_streak = 0  # skipped optimizer steps in a row

    def count_step(self, skipped: bool) -> str | None:
        """Count an optimizer step; a reason to stop after ``max_skipped_streak`` skipped ones in a row."""
        self.skipped_steps += int(skipped)
        self.skip_streak = self.skip_streak + 1 if skipped else 0
        if self.max_skipped_streak is not None and self.skip_streak >= self.max_skipped_streak:
            return (f"{self.skip_streak} optimizer steps in a row had a non-finite loss or gradient norm "
                    "(or raise optim.max_skipped_streak)")
        return None

    def check_parameters(self, before: torch.Tensor, after: torch.Tensor) -> str | None:
        """A reason to stop when the update left a parameter norm (:func:`param_norms`, ``[1 or 2]``: actor,
        critic) not finite, or ``after`` it more than ``max_param_norm_growth`` times its norm ``before``."""
        if not torch.isfinite(after).all():
            return "parameter norm not finite after the update"
        growth = self.max_param_norm_growth
        if growth is not None and bool((after > growth * before).any()):
            ratios = ", ".join(f"{name} {float(a / b):.3g}x" for name, a, b in zip(("actor", "critic"), after, before))
            return f"parameter norm grew in one update ({ratios}), more than optim.max_param_norm_growth={growth}"
        return None

    def state_dict(self) -> dict[str, int]:
        return {"skipped_steps": self.skipped_steps, "skip_streak": self.skip_streak}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.skipped_steps = state.get("skipped_steps", 0)
        self.skip_streak = state.get("skip_streak", 0)


def old_policy_not_finite(old: dict[str, torch.Tensor], mask: torch.Tensor,
                          reduce: Callable[[torch.Tensor], torch.Tensor]) -> str | None:
    """A reason to stop (every rank alike: ``reduce`` sums over ranks) when the old policy gave a non-finite
    log-prob, entropy or value ``[N, L]`` on a response token (``mask``), in the old-policy pass or in the update's
    first forward: the weights have diverged, and the entropy window must not take the step's mean."""
    names = [name for name in ("old_logprobs", "entropy", "old_values") if name in old]
    bad = int(reduce(torch.stack([(~torch.isfinite(old[name][mask])).sum() for name in names]).sum().float()))
    return f"the old policy gave {bad} non-finite log-probs, entropies or values" if bad else None


@torch.no_grad()
def param_norms(models: Iterable[torch.nn.Module | None],
                reduce_zero3: Callable[[torch.Tensor], torch.Tensor] | None) -> torch.Tensor:
    """L2 norms ``[M]`` (fp32) of the trainable parameters of each of ``models`` that is not None: one norm per
    parameter, no copy of the weights. Under ZeRO-3 ``reduce_zero3`` sums the squares of the shards over ranks."""
    squares = []
    for model in models:
        if model is not None:
            params = [local_values(p) for p in model.parameters() if p.requires_grad]
            squares.append(torch.stack([torch.linalg.vector_norm(p).float() for p in params]).square().sum())
    squares = torch.stack(squares)
    return (reduce_zero3(squares) if reduce_zero3 is not None else squares).sqrt()


def diverged_error(rl_step: int, reason: str, checkpoint_dir: str | None) -> TrainingDiverged:
    """The one-line error that stops the run in RL step ``rl_step`` before it is checkpointed: ``reason`` and the
    checkpoint to resume from, the newest one in ``checkpoint_dir`` (the last good state: nothing later was saved)."""
    newest = newest_checkpoint(checkpoint_dir)
    resume = f"resume with ckpt_path={newest}" if newest is not None else "start again (no checkpoint exists yet)"
    return TrainingDiverged(
        f"training diverged at RL step {rl_step}: {reason}. Stopped without checkpointing this step: "
        f"lower optim.actor_lr / optim.critic_lr and {resume}"
    )
