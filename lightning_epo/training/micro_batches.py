"""How one RL step's rows are cut into mini-batches (the optimizer steps) and micro-batches (the passes of the
old-policy pass and of each mini-batch), which rows the update's own forward gives the old policy's outputs, and what
the decoders compute once in a micro-batch (``model.fold_turns``, ``model.shared_prefix``).

Every rank must run as many passes as the others: DDP and DeepSpeed reduce gradients in every backward pass and
every ZeRO-3 forward all-gathers the parameter shards. Both functions take the all-rank agreement as a callable
(the module's reduction; the identity on one process).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import torch

from lightning_epo.algos.losses import LOSSES_WITHOUT_OLD_LOGPROBS
from lightning_epo.models.shared_prefix import Sharing, prefix_hosts, shared_prefix_length
from lightning_epo.rollout.batch import RolloutBatch


def plan_micro_batches(
    batch: RolloutBatch, groups: list[torch.Tensor], micro_batch_size: int, micro_batch_tokens: int | None,
    fold: bool, reduce: Callable[..., torch.Tensor], by_episode: bool = False,
) -> list[list[torch.Tensor]]:
    """Each of ``groups`` (row indices ``[n]`` of ``batch``) cut into micro-batches: of at most ``micro_batch_size``
    rows, or with ``micro_batch_tokens`` sorted by length and packed up to that many tokens of padded size
    (:meth:`RolloutBatch.split_by_tokens`). With ``by_episode`` (``algo.batch_by_episode``) a micro-batch holds the
    rows of one episode, and the token budget counts once the prefix that all of the episode's rows share (its fixed
    prompt text, which ``model.shared_prefix`` computes once a micro-batch). With ``fold`` the rows cut are the
    hosts (:func:`prefix_hosts`, the rows the decoders compute; of the episode's rows with ``by_episode``) and each
    row joins its host's micro-batch. Every group gets the largest pass count of any rank (``reduce(t, "max")``): a
    rank with fewer gets empty micro-batches (:func:`rows_or_first`).
    """
    def most_passes(local: list[int]) -> list[int]:
        device = groups[0].device if groups else None
        return reduce(torch.tensor(local, device=device), "max").clamp(min=1).tolist()

    parts = [episode_rows(batch.traj_ids, rows) if by_episode else [rows] for rows in groups]  # per group: [n_e] each
    hosts = [[part[prefix_hosts(batch.input_ids[part], batch.attention_mask[part])] if fold else part for part in group]
             for group in parts]  # aligned with parts: batch indices
    computed = [[host.unique() if fold else part for part, host in zip(group, group_hosts)]
                for group, group_hosts in zip(parts, hosts)]
    if micro_batch_tokens is None and not by_episode:  # rows spread evenly over the passes
        counts = most_passes([math.ceil(len(rows) / micro_batch_size) for (rows,) in computed])
        cuts = [list(rows.tensor_split(count)) for (rows,), count in zip(computed, counts)]
    else:
        cuts = [[cut for rows in group for cut in _cut(batch, rows, micro_batch_size, micro_batch_tokens, by_episode)]
                for group in computed]
        counts = most_passes([len(cut) for cut in cuts])
        cuts = [cut + [rows[:0]] * (count - len(cut)) for rows, cut, count in zip(groups, cuts, counts)]
    if not fold:
        return cuts
    return [[torch.cat(group)[torch.isin(torch.cat(group_hosts), cut)] for cut in group_cuts]  # each row beside
            for group, group_hosts, group_cuts in zip(parts, hosts, cuts)]                     # its host


def _cut(batch: RolloutBatch, rows: torch.Tensor, micro_batch_size: int, micro_batch_tokens: int | None,
         one_episode: bool) -> list[torch.Tensor]:
    """``rows`` ``[n]`` cut into micro-batches of at most ``micro_batch_size`` rows (spread evenly) or
    ``micro_batch_tokens`` tokens, the prefix all of ``rows`` share counted once where they are ``one_episode``'s."""
    if micro_batch_tokens is None:
        return list(rows.tensor_split(math.ceil(len(rows) / micro_batch_size)))
    shared = one_episode and len(rows) > 1
    prefix = shared_prefix_length(batch.input_ids[rows], batch.attention_mask[rows]) if shared else 0
    return batch.split_by_tokens(rows, micro_batch_tokens, prefix)


def episode_rows(traj_ids: torch.Tensor, rows: torch.Tensor) -> list[torch.Tensor]:
    """``rows`` ``[n]`` split by episode (``traj_ids`` ``[N]``, of every row of the batch): one index tensor per
    episode, in the order of the episodes' ids, its rows in their order in ``rows``."""
    ids = traj_ids[rows]
    return [rows[ids == episode] for episode in ids.unique()]


def step_mini_batches(traj_ids: torch.Tensor, algo: Mapping[str, Any], seed: int
                      ) -> tuple[list[list[torch.Tensor]], int]:
    """One RL step's mini-batches: every PPO epoch (``algo.ppo_epochs``) a random permutation (drawn from ``seed``)
    of the step's rows (``traj_ids`` ``[N]``: each row's episode), or with ``algo.batch_by_episode`` of its episodes,
    cut into ``algo.mini_batches`` parts of row indices ``[~N / mini_batches]``; and :func:`update_fills`' count."""
    generator, parts = torch.Generator().manual_seed(seed), algo["mini_batches"]
    if algo.get("batch_by_episode"):
        episodes = traj_ids.unique()
        draws = (episodes[torch.randperm(len(episodes), generator=generator).to(episodes.device)]
                 for _ in range(algo["ppo_epochs"]))
        minis = [[torch.isin(traj_ids, part).nonzero().squeeze(1) for part in order.tensor_split(parts)]
                 for order in draws]
    else:
        minis = [list(torch.randperm(len(traj_ids), generator=generator).to(traj_ids.device).tensor_split(parts))
                 for _ in range(algo["ppo_epochs"])]
    reads_old = algo.get("policy_loss", "clipped") not in LOSSES_WITHOUT_OLD_LOGPROBS
    return minis, update_fills(minis, bool(algo.get("advantage_shaping")), reads_old)


def update_fills(minis: list[list[torch.Tensor]], entropy_shaped: bool, loss_reads_old: bool) -> int:
    """How many of the first epoch's mini-batches (of ``minis``) give their rows' old log-probs and entropies from
    the update's own forward, so that the old-policy pass leaves those rows out (:func:`filled_rows`).

    Where the loss reads the old log-probs (PPO's ratio, Eq. 3), 1: the first mini-batch's forward comes before the
    first optimizer step, so it runs on the rollout's policy (all rows with one epoch of one mini-batch, the
    default). Where it reads none (``loss_reads_old`` False: the nll loss of ``algo=sft``), every mini-batch of the
    first epoch: each row's first forward gives its log-probs and entropies under the policy as it trains (the
    step's entropy panels and ``ppo/approx_kl`` then describe that policy, not the one that played), and the actor
    has no old-policy pass. 0 where advantages are ``entropy_shaped`` (``algo.advantage_shaping``: they read the
    old entropies before the update)."""
    return 0 if entropy_shaped else len(minis[0]) if not loss_reads_old else 1


def filled_rows(minis: list[list[torch.Tensor]], fills: int) -> torch.Tensor:
    """The rows ``[m]`` of the first epoch's first ``fills`` mini-batches (:func:`update_fills`)."""
    return torch.cat(minis[0][:fills]) if fills else minis[0][0][:0]


def rows_or_first(rows: torch.Tensor) -> torch.Tensor:
    """``rows``, or row 0 for an empty micro-batch: a pass whose result is discarded (or weighted 0), run so that
    this rank takes part in the other ranks' collectives."""
    return rows if len(rows) else torch.zeros(1, dtype=torch.long, device=rows.device)


def micro_batch_sharing(
    mb: RolloutBatch, fold: bool, shared_prefix: bool, reduce_zero3: Callable[..., torch.Tensor] | None
) -> Sharing:
    """What the decoders compute once in ``mb``: with ``fold`` only the rows that begin no other
    (:func:`prefix_hosts`), with ``shared_prefix`` the leading tokens of those rows (0 for one row: nothing to
    share). Under ZeRO-3 (``reduce_zero3``: the reduction over ranks, else None) every rank must run the decoder as
    many times (two passes with a prefix, one without): a prefix is used only where every rank has one. Folding
    changes no pass count.
    """
    folded = Sharing()
    if fold:
        hosts = prefix_hosts(mb.input_ids, mb.attention_mask)
        if not bool((hosts == torch.arange(len(mb), device=hosts.device)).all()):  # else nothing folds: no gather
            folded = Sharing.from_hosts(hosts)
    if not shared_prefix:
        return folded
    rows = slice(None) if folded.computed is None else folded.computed
    ids, mask = mb.input_ids[rows], mb.attention_mask[rows]
    prefix = shared_prefix_length(ids, mask) if len(ids) > 1 else 0
    if reduce_zero3 is not None and not bool(reduce_zero3(torch.tensor(int(prefix > 0), device=ids.device), "min")):
        prefix = 0
    return replace(folded, prefix=prefix)
