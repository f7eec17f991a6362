"""Advantage estimators over agent tokens, registered by name (``algo.advantage``).

Rows are turn samples ``[N, L]`` (prompt + response tokens); only response tokens (mask 1) carry
advantages. Each turn's reward sits on the last response token of that turn; the turns of one
trajectory form one sequence of agent tokens (environment tokens are skipped, never trained on).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lightning_epo.algos.registry import Registry

ADVANTAGES: Registry = Registry("advantage estimator")


@dataclass
class AdvantageInputs:
    """One RL step's batch as the estimators see it.

    mask ``[N, L]``; turn_rewards, episode_returns, traj_ids, turn_idx, group_ids ``[N]``;
    values ``[N, L]`` (old critic values, PPO only); state_ids ``[N]`` (GiGPO's anchor states: rows with
    the same id were played from the same environment state of the same group).
    """

    mask: torch.Tensor
    turn_rewards: torch.Tensor
    episode_returns: torch.Tensor
    traj_ids: torch.Tensor
    turn_idx: torch.Tensor
    group_ids: torch.Tensor
    values: torch.Tensor | None = None
    state_ids: torch.Tensor | None = None


def _agent_token_sequences(inp: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Lay each trajectory's response tokens end to end, turn by turn.

    Returns ``rows [B, S]``, ``cols [B, S]`` (positions into ``[N, L]``) and ``valid [B, S]``, where ``S``
    is the longest trajectory's number of agent tokens.
    """
    mask = inp.mask.bool()
    order = sorted(range(mask.shape[0]), key=lambda r: (int(inp.traj_ids[r]), int(inp.turn_idx[r])))
    per_traj: dict[int, list[torch.Tensor]] = {}
    for r in order:
        cols = mask[r].nonzero().squeeze(-1)
        per_traj.setdefault(int(inp.traj_ids[r]), []).append(torch.stack([torch.full_like(cols, r), cols], -1))
    seqs = [torch.cat(parts) for parts in per_traj.values()]
    longest = max((len(s) for s in seqs), default=0)
    rows = torch.zeros(len(seqs), longest, dtype=torch.long, device=mask.device)
    cols = torch.zeros_like(rows)
    valid = torch.zeros_like(rows, dtype=torch.bool)
    for b, s in enumerate(seqs):
        rows[b, : len(s)], cols[b, : len(s)], valid[b, : len(s)] = s[:, 0], s[:, 1], True
    return rows, cols, valid


def last_token_rewards(mask: torch.Tensor, turn_rewards: torch.Tensor) -> torch.Tensor:
    """``[N, L]`` token rewards: each row's ``turn_rewards[n]`` on its last response token, 0 elsewhere."""
    mask = mask.bool()
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, -1).max(-1).values
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    has = last >= 0
    out[has.nonzero().squeeze(-1), last[has]] = turn_rewards[has].float()
    return out


def _turn_ends(rows: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``[B, S]`` bool: the agent token is the last of its turn (the next one is another row, or none)."""
    next_rows = F.pad(rows[:, 1:], (0, 1), value=-1)
    next_valid = F.pad(valid[:, 1:], (0, 1), value=False)
    return valid & ((next_rows != rows) | ~next_valid)


@ADVANTAGES.register("gae")
def gae_advantages(
    inp: AdvantageInputs, gamma: float = 1.0, lam: float = 1.0, unit: str = "turn"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the agent tokens of each trajectory (PPO).

    ``delta_t = r_t + g_t V_{t+1} - V_t``, ``A_t = delta_t + g_t l_t A_{t+1}``, with ``t`` running over the
    trajectory's response tokens in turn order, ``r_t`` the turn reward on each turn's last token and ``V``
    after the trajectory's last token taken as 0. ``values[:, p]`` is the critic's value of the state before
    token ``p`` (:class:`~lightning_epo.models.critic.ValueModel`), so a turn's state value is read at its first
    response token: the state after the whole prompt.

    ``unit="turn"`` (default): ``g_t = gamma``, ``l_t = lam`` at a turn's last token and 1 inside a turn, so
    gamma and lambda act once per environment step (verl-agent / GiGPO discount per step). Every token of turn
    ``k`` then gets the same return target, the turn-level lambda-return
    ``R_k = r_k + gamma ((1 - lam) V_{k+1} + lam R_{k+1})`` (``V_{k+1}`` at turn ``k+1``'s first token), and the
    advantage ``R_k - V_t`` against its own value. ``unit="token"``: ``g_t = gamma``, ``l_t = lam`` at every
    token, as single-turn RLHF code does (a 7-token turn discounts by ``gamma^7``).
    Values and rewards on non-agent positions are never read.

    Returns ``advantages [N, L]`` and ``returns [N, L]`` (= A + V, the critic's targets), 0 off the mask.
    """
    if inp.values is None:
        raise ValueError("algo.advantage=gae needs a critic: set algo.critic=true or use algo.advantage=grpo")
    if unit not in ("turn", "token"):
        raise ValueError(f"algo.gae.unit={unit!r} is not valid; choose one of: turn, token")
    rows, cols, valid = _agent_token_sequences(inp)
    rewards = last_token_rewards(inp.mask, inp.turn_rewards)[rows, cols] * valid
    values = inp.values.float()[rows, cols] * valid
    discounted = _turn_ends(rows, valid) if unit == "turn" else valid
    gammas = torch.where(discounted, gamma, 1.0)
    lams = torch.where(discounted, lam, 1.0)
    adv_seq = torch.zeros_like(values)
    next_adv = values.new_zeros(values.shape[0])
    next_value = values.new_zeros(values.shape[0])
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gammas[:, t] * next_value - values[:, t]
        next_adv = torch.where(valid[:, t], delta + gammas[:, t] * lams[:, t] * next_adv, next_adv)
        next_value = torch.where(valid[:, t], values[:, t], next_value)
        adv_seq[:, t] = next_adv
    advantages = values.new_zeros(inp.mask.shape)
    returns = values.new_zeros(inp.mask.shape)
    advantages[rows[valid], cols[valid]] = adv_seq[valid]
    returns[rows[valid], cols[valid]] = (adv_seq + values)[valid]
    return advantages, returns


def group_normalised(scores: torch.Tensor, groups: torch.Tensor, eps: float = 1e-6, norm_by_std: bool = True) -> torch.Tensor:
    """``(s - mean_g s) / (std_g s + eps)`` within each group ``g`` (``norm_by_std=False``: ``s - mean_g s``).

    ``scores`` and ``groups`` are ``[M]``; a group of one scores 0. Returns ``[M]`` float32.
    """
    scores = scores.float()
    out = torch.zeros_like(scores)
    for g in torch.unique(groups):
        members = groups == g
        s = scores[members]
        centred = s - s.mean()
        std = s.std() if s.numel() > 1 else s.new_zeros(())
        out[members] = centred / (std + eps) if norm_by_std else centred
    return out


@ADVANTAGES.register("grpo")
def grpo_advantages(
    inp: AdvantageInputs, eps: float = 1e-6, norm_by_std: bool = True
) -> tuple[torch.Tensor, None]:
    """Group-normalised advantages (GRPO): a group is the rollouts of one task.

    ``A_j = (R_j - mean_g R) / (std_g R + eps)`` with ``R_j`` the episode return of trajectory ``j``
    (each trajectory counted once, however many turns it has); ``norm_by_std=False`` gives ``R_j - mean_g R``,
    one half of Dr. GRPO (Liu et al. 2025), whose other half, no division by a response's own length, is
    ``algo.loss_agg=seq_sum_norm`` (both in ``algo=drgrpo``). ``A_j`` is broadcast to every response token
    of every turn of ``j``.
    Returns ``advantages [N, L]`` and ``None`` (no critic targets).
    """
    traj_unique, row_to_traj = torch.unique(inp.traj_ids, return_inverse=True)
    a_row_of_traj = torch.zeros(len(traj_unique), dtype=torch.long, device=row_to_traj.device).scatter(
        0, row_to_traj, torch.arange(len(row_to_traj), device=row_to_traj.device)
    )
    adv_traj = group_normalised(
        inp.episode_returns[a_row_of_traj], inp.group_ids[a_row_of_traj], eps, norm_by_std
    )
    return adv_traj[row_to_traj][:, None] * inp.mask.float(), None


def discounted_turn_returns(turn_rewards: torch.Tensor, traj_ids: torch.Tensor, turn_idx: torch.Tensor, gamma: float) -> torch.Tensor:
    """``R_t = sum_{k >= t} gamma^(k-t) r_k`` over the turns of each trajectory (GiGPO's step return).

    All arguments are ``[N]`` (one entry per turn row, any order); returns ``[N]`` float32.
    """
    rewards, trajs, turns = turn_rewards.tolist(), traj_ids.tolist(), turn_idx.tolist()
    returns = [0.0] * len(rewards)
    running, current = 0.0, None
    for r in sorted(range(len(rewards)), key=lambda r: (trajs[r], -turns[r])):  # each trajectory, last turn first
        if trajs[r] != current:
            running, current = 0.0, trajs[r]
        running = rewards[r] + gamma * running
        returns[r] = running
    return torch.tensor(returns, dtype=torch.float32, device=turn_rewards.device)


@ADVANTAGES.register("gigpo")
def gigpo_advantages(
    inp: AdvantageInputs, gamma: float = 0.95, step_weight: float = 1.0, eps: float = 1e-6, norm_by_std: bool = True
) -> tuple[torch.Tensor, None]:
    """GiGPO (Feng et al. 2025): GRPO's episode advantage plus a step advantage over anchor states.

    ``A = A^E + step_weight * A^S``: ``A^E`` is :func:`grpo_advantages`; ``A^S`` group-normalises each
    turn's discounted return (:func:`discounted_turn_returns`) among the turns played from the same
    environment state within the same group (``state_ids``); a state seen once gets ``A^S = 0``, as in
    verl-agent (``gigpo/core_gigpo.py``, ``step_norm_reward``: a step group of one takes its own return as
    mean and 1 as std). Its episode level differs from ``A^E`` here, which is kept: ``episode_norm_reward``
    takes a group's mean and std over all its turn rows (a trajectory weighs by its number of turns, where
    :func:`grpo_advantages` counts each once), and a group of a single turn row keeps its raw return (mean 0,
    std 1), where a group of one trajectory scores 0 here.
    The sum is broadcast to the turn's response tokens. Returns ``advantages [N, L]`` and ``None``.
    """
    if inp.state_ids is None:
        raise ValueError("algo.advantage=gigpo needs state_ids (the batch's anchor states)")
    episode, _ = grpo_advantages(inp, eps, norm_by_std)
    step_returns = discounted_turn_returns(inp.turn_rewards, inp.traj_ids, inp.turn_idx, gamma)
    step = group_normalised(step_returns, inp.state_ids, eps, norm_by_std)
    return episode + step_weight * step[:, None] * inp.mask.float(), None


def entropy_shaped_advantage(
    advantages: torch.Tensor, entropy: torch.Tensor, alpha: float = 0.4, kappa: float = 2.0
) -> torch.Tensor:
    """Entropy-based advantage shaping (Cheng et al. 2025, the ``ppo_ea`` ablation):
    ``A' = A + min(alpha * H.detach(), |A| / kappa)``, elementwise on ``[N, L]`` (``H`` from the old
    policy). The bonus is capped by ``|A|/kappa`` so it never flips the sign of ``A``."""
    return advantages + torch.minimum(alpha * entropy.detach(), advantages.abs() / kappa)


def whiten(
    advantages: torch.Tensor, mask: torch.Tensor, reduce: Callable[[torch.Tensor], torch.Tensor] | None = None
) -> torch.Tensor:
    """PPO's advantage whitening: ``(A - mean) / (std + 1e-8)`` over the response tokens of the whole RL step.

    ``advantages`` and ``mask`` are ``[N, L]``; ``reduce`` sums the ``[3]`` moments (sum, sum of squares, count)
    over ranks (identity if None), so every rank whitens with the same statistics. Returns ``[N, L]``, 0 off the mask.
    """
    mask = mask.bool()
    moments = torch.stack([advantages[mask].sum(), (advantages[mask] ** 2).sum(), mask.sum().float()])
    if reduce is not None:
        moments = reduce(moments)
    mean = moments[0] / moments[2]
    std = (moments[1] / moments[2] - mean**2).clamp(min=0).sqrt()
    return (advantages - mean) / (std + 1e-8) * mask
