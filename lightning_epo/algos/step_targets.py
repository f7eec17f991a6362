"""What one RL step fixes before its update: the advantages (Eq. 2's A, from ``algo.advantage``'s estimator) and
the loss-aggregation weights (Eq. 4's over all ranks, or ``algo.loss_agg``'s departure)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from lightning_epo.algos.advantages import ADVANTAGES, AdvantageInputs, entropy_shaped_advantage, whiten
from lightning_epo.algos.aggregation import (
    sequence_sum_weights, token_mean_weights, trajectory_weights, turn_and_trajectory_counts,
)
from lightning_epo.algos.objective import StepTargets

Reduce = Callable[[torch.Tensor], torch.Tensor]  # a sum over ranks (the identity on one process)


def step_advantages(
    inputs: AdvantageInputs, entropy: torch.Tensor, algo: Mapping[str, Any], reduce: Reduce
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Advantages ``[N, L]`` (0 off ``inputs.mask``) and the critic's returns ``[N, L]`` (None without a critic):
    ``algo.advantage``'s estimator with its own settings (``algo[<name>]``), then PPO's whitening over all ranks
    (``algo.whiten_advantages``) and the ``ppo_ea`` ablation's entropy shaping (``algo.advantage_shaping``, from the
    old policy's token entropies ``entropy`` ``[N, L]``)."""
    advantages, returns = ADVANTAGES.get(algo["advantage"])(inputs, **algo.get(algo["advantage"]) or {})
    if algo["whiten_advantages"]:
        advantages = whiten(advantages, inputs.mask, reduce)
    if shaping := algo.get("advantage_shaping"):
        advantages = entropy_shaped_advantage(advantages, entropy, shaping["alpha"], shaping["kappa"]) * inputs.mask
    return advantages, returns


def step_targets(
    inputs: AdvantageInputs, old: Mapping[str, torch.Tensor], algo: Mapping[str, Any], reduce: Reduce
) -> StepTargets:
    """RL step k's :class:`StepTargets` from its batch (``inputs``) and old-policy pass ``old`` (``old_logprobs``,
    ``entropy``, and ``old_values`` / ``ref_logprobs`` where the run has them, all ``[N, L]``). The weights count
    trajectories, tokens and turns over all ranks (``reduce``), so micro-batching, mini-batching and data
    parallelism never change the loss; ``algo.loss_agg`` picks L_MT's: ``trajectory`` (Eq. 4), ``token`` or
    ``seq_sum_norm``."""
    mask, traj_ids = inputs.mask, inputs.traj_ids
    tokens, _, local_trajectories = turn_and_trajectory_counts(mask, traj_ids)
    counts = [local_trajectories, tokens.sum(), (tokens > 0).sum()]  # trajectories, tokens, turns with tokens
    totals = reduce(torch.tensor([float(c) for c in counts], device=mask.device)).long().tolist()
    traj_w = trajectory_weights(mask, traj_ids, totals[0])
    agg = algo["loss_agg"]
    mean_w = traj_w if agg == "trajectory" else token_mean_weights(mask, totals[1])
    pg_w = sequence_sum_weights(mask, algo["loss_scale_factor"], totals[2]) if agg == "seq_sum_norm" else mean_w
    advantages, returns = step_advantages(inputs, old["entropy"], algo, reduce)
    return StepTargets(
        old_logprobs=old["old_logprobs"], advantages=advantages, pg_weights=pg_w, traj_weights=traj_w,
        mean_weights=mean_w, returns=returns, old_values=old.get("old_values"), ref_logprobs=old.get("ref_logprobs"),
    )
