"""Where in a trajectory the entropy sits (paper Fig. 1 and Fig. 7d): early vs late turns and tokens."""

from __future__ import annotations

import torch


def entropy_panel_sums(
    entropy: torch.Tensor,
    mask: torch.Tensor,
    traj_ids: torch.Tensor,
    turn_idx: torch.Tensor,
    edge_turns: int = 2,
    edge_tokens: int = 10,
) -> torch.Tensor:
    """``(sum, count)`` of token entropies for the four panels, as one tensor ready for an all-rank sum.

    Args:
        entropy, mask: ``[N, L]`` token entropies and response mask; traj_ids, turn_idx: ``[N]``.
        edge_turns: the first / last turns of each trajectory that count as early / late.
        edge_tokens: the first / last tokens of each response that count as early / late.
    Returns:
        ``[8]``: sum and count for ``early_turns``, ``late_turns``, ``early_tokens``, ``late_tokens``.
    """
    mask = mask.bool()
    _, traj = torch.unique(traj_ids, return_inverse=True)
    last_turn = torch.zeros(int(traj.max()) + 1 if len(traj) else 0, dtype=turn_idx.dtype, device=turn_idx.device)
    last_turn = last_turn.scatter_reduce(0, traj, turn_idx, reduce="amax", include_self=False)[traj]
    early_rows = (turn_idx < edge_turns)[:, None]
    late_rows = (turn_idx > last_turn - edge_turns)[:, None]
    rank = mask.long().cumsum(-1)  # 1-based position inside the response
    length = mask.sum(-1, keepdim=True)
    selections = (
        mask & early_rows,
        mask & late_rows,
        mask & (rank <= edge_tokens),
        mask & (rank > length - edge_tokens),
    )
    return torch.stack([x for sel in selections for x in (entropy[sel].sum(), sel.sum().float())])
