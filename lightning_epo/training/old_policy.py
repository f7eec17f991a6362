"""One RL step's old-policy pass (no grad): what the update's ratio, advantages, KL term and entropy window read from
the policy that collected the rollout, computed before the update.

The actor's log-probs and entropies of the rows the update reaches before its first optimizer step are left to the
update's own forward (:func:`lightning_epo.training.micro_batches.update_fills`): it runs on the same policy, so
the pass would compute them twice. With one epoch of one mini-batch (the default), or a loss that reads no old
log-probs (``algo=sft``'s nll: every row's first forward gives them), the actor has no pass at all.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from lightning_epo.rollout.batch import RolloutBatch
from lightning_epo.training.micro_batches import rows_or_first

Plan = Callable[[RolloutBatch, list[torch.Tensor]], list[list[torch.Tensor]]]
Outputs = Callable[[RolloutBatch, bool], dict[str, torch.Tensor]]


@torch.no_grad()
def old_policy_pass(batch: RolloutBatch, filled: torch.Tensor, others: bool, plan: Plan, outputs: Outputs,
                    reduce: Callable[..., torch.Tensor]) -> dict[str, torch.Tensor]:
    """``old_logprobs`` and ``entropy`` ``[N, L]``: ``outputs(mb, True)`` on the micro-batches of the rows not in
    ``filled`` ``[m]`` (zeros on those, for the update to fill); with ``others`` (a critic, a KL reference) also
    ``outputs(mb, False)``'s ``old_values`` / ``ref_logprobs`` ``[N, L]`` over every row. ``plan(batch, groups)``
    cuts each group of rows into micro-batches with the same pass count on every rank, and ``reduce(t, "max")``
    (over ranks) leaves the actor's pass out only where no rank has a row for it."""
    device = batch.input_ids.device
    out = {name: torch.zeros(batch.input_ids.shape, device=device) for name in ("old_logprobs", "entropy")}
    every_row = torch.arange(len(batch), device=device)
    actor_rows = every_row[~torch.isin(every_row, filled)]
    groups = {"actor": actor_rows} if int(reduce(torch.tensor(len(actor_rows), device=device), "max")) else {}
    groups |= {"others": every_row} if others else {}
    for group, micro_batches in zip(groups, plan(batch, list(groups.values()))):
        for rows in micro_batches:
            mb = batch.select(rows_or_first(rows))
            for name, value in outputs(mb, group == "actor").items():
                target = out.setdefault(name, torch.zeros_like(out["entropy"]))
                target[rows, : mb.input_ids.shape[1]] = value[: len(rows)]
    return out
