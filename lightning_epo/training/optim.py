"""Optimizer groups and the LR schedule over RL steps (cosine with warmup ratio and min-LR ratio)."""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch.optim.lr_scheduler import LambdaLR

from lightning_epo.training.distributed import is_deepspeed


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


def use_configured_lrs(scheduler: LambdaLR, lrs: dict[str, float]) -> None:
    """Train at the configured rates ``lrs`` (by parameter group name), on resume too: Lightning restores the
    optimizer's and the scheduler's rates from the checkpoint, so "lower optim.actor_lr and resume" would keep the
    old one. The restored schedule position is kept; with an unchanged config this rewrites the values already there
    (the scheduler's own ``base_lr * factor(k)``), so an exact resume stays exact."""
    scheduler.base_lrs = [lrs[group["name"]] for group in scheduler.optimizer.param_groups]
    for group, base_lr, factor in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["initial_lr"], group["lr"] = base_lr, base_lr * factor(scheduler.last_epoch)


def clip_and_step(opt: Any, strategy: Any, grad_clip: float) -> bool:
    """One optimizer step of Lightning's wrapped optimizer ``opt``: each parameter group (actor, critic) clipped on
    its own to ``grad_clip``, as verl clips each model; a step whose gradient norm is not finite (after DDP's average:
    on every rank alike) is skipped. Under DeepSpeed the engine clips over all parameters and skips such a step
    itself. Returns whether the step was skipped; the gradients are zeroed either way."""
    if is_deepspeed(strategy):
        opt.step()
        skipped = not strategy.deepspeed_engine.was_step_applied()
    else:
        norms = [torch.nn.utils.clip_grad_norm_(group["params"], grad_clip) for group in opt.optimizer.param_groups]
        skipped = not all(torch.isfinite(n) for n in norms)
        if not skipped:
            opt.step()
    opt.zero_grad()
    return skipped
