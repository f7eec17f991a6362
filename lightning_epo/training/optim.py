"""Optimizer groups and the LR schedule over RL steps (cosine with warmup ratio and min-LR ratio)."""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch.optim.lr_scheduler import LambdaLR


def cosine_with_warmup(total_steps: int, warmup_ratio: float = 0.1, min_lr_ratio: float = 0.2) -> Callable[[int], float]:
    """LR multiplier at RL step ``k``: linear warmup over ``ceil(warmup_ratio * K)`` steps, then cosine from
    1 down to ``min_lr_ratio`` at ``k = K``."""
    warmup = math.ceil(warmup_ratio * total_steps)

    def factor(k: int) -> float:
        if k < warmup:
            return (k + 1) / warmup
        progress = min((k - warmup) / max(total_steps - warmup, 1), 1.0)
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def build_optimizer(
    make_optimizer: Callable[..., torch.optim.Optimizer],
    actor: torch.nn.Module,
    critic: torch.nn.Module | None,
    actor_lr: float,
    critic_lr: float,
) -> torch.optim.Optimizer:
    """ONE optimizer (DeepSpeed allows one) whose parameter groups are the actor and, for PPO, the critic."""
    groups = [{"params": [p for p in actor.parameters() if p.requires_grad], "lr": actor_lr, "name": "actor"}]
    if critic is not None:
        groups.append({"params": [p for p in critic.parameters() if p.requires_grad], "lr": critic_lr, "name": "critic"})
    return make_optimizer(groups)


def build_scheduler(optimizer: torch.optim.Optimizer, total_steps: int, warmup_ratio: float, min_lr_ratio: float) -> LambdaLR:
    """One scheduler step per RL step (not per optimizer step), so the schedule's K is ``total_steps``."""
    return LambdaLR(optimizer, cosine_with_warmup(total_steps, warmup_ratio, min_lr_ratio))
