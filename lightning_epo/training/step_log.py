"""RL step k's logged metrics (DESIGN.md's table; names in :mod:`lightning_epo.core.metric_names`): every rank's
sums gathered once (:class:`RankSums`), reduced in one collective, and turned into the values every rank logs
alike. A metric that does not exist in the run (no critic, no smoothing, no tokens in a panel) is left out."""

from __future__ import annotations

import torch

from lightning_epo.algos import out_of_range
from lightning_epo.algos.losses import (
    critic_means_from_moments, explained_variance_from_moments, explained_variance_moments,
)
from lightning_epo.algos.objective import ObjectiveSettings, StepTargets
from lightning_epo.core.metric_names import LOSS_TERMS, PANELS, ROLLOUT_COUNTS
from lightning_epo.rollout.batch import RolloutBatch
from lightning_epo.training.entropy_panels import entropy_panel_sums
from lightning_epo.training.step_metrics import RankSums, ratio, sampler_gap_sums, turn_entropy_sums


def step_sums(
    batch: RolloutBatch, entropy: torch.Tensor, targets: StepTargets, terms: dict[str, float], s: ObjectiveSettings,
    edges: tuple[int, int], max_turns: int,
) -> RankSums:
    """This rank's sums for the step's metrics: the rollout's stats, the update's loss terms (``terms``), the
    old-policy token entropies ``entropy`` ``[N, L]`` (overall, by panel with ``edges`` = (turns, tokens) at each
    end, by turn index below ``max_turns``), the engine's log-probs against the old policy's, the tokens outside
    Eq. 5's band and the old critic's moments."""
    mask = batch.response_mask
    sums = RankSums(entropy.device)
    for name, value in [*batch.stats.items(), *((f"terms/{n}", v) for n, v in terms.items())]:
        sums.add(name, value)
    sums.add("entropy", torch.stack([entropy[mask].sum(), mask.sum().float()]))
    sums.add("panels", entropy_panel_sums(entropy, mask, batch.traj_ids, batch.turn_idx, *edges))
    sums.add("turns", turn_entropy_sums(entropy, mask, batch.turn_idx, max_turns))
    sums.add("sampler_gap", sampler_gap_sums(batch.sampler_logprobs, targets.old_logprobs, mask))
    if s.entropy_ref is not None:  # logged where EPO's term is on, smoothing or not (step_metrics)
        sums.add("out_of_range", out_of_range(entropy[mask], s.entropy_ref, s.kappa_l, s.kappa_r).sum())
    if targets.returns is not None:  # the old critic against the targets it is trained on this step
        sums.add("critic", explained_variance_moments(targets.returns, targets.old_values, mask))
    return sums


def step_metrics(
    total: dict[str, torch.Tensor], stats: list[str], terms: dict[str, float], s: ObjectiveSettings, world_size: int,
    entropy_regularised: bool,
) -> dict[str, float]:
    """The step's values from the all-rank sums ``total`` (:func:`step_sums`): the rollout's ``stats`` (counts add
    up over ranks, rates average), the loss terms, the PPO diagnostics, the engine's mean log-prob gap (with engine
    log-probs), λ_k (where ``entropy_regularised``: ``algo.entropy_coef > 0``), β_k (with smoothing), H̄ and the
    share of tokens outside Eq. 5's band (EPO: smoothing, or the entropy term without it, EPO-Base), the entropy
    panels, the critic's mean value and return target and its explained variance (undefined when the returns do not
    vary)."""
    metrics = {name: float(total[name] if name in ROLLOUT_COUNTS else total[name] / world_size) for name in stats}
    metrics |= {f"loss/{name}": float(total[f"terms/{name}"]) for name in LOSS_TERMS if name in terms}
    metrics |= {"ppo/clipfrac": float(total["terms/clipfrac"]), "ppo/approx_kl": float(total["terms/approx_kl"])}
    if (gap := ratio(total["sampler_gap"])) is not None:
        metrics["train/sampler_logprob_gap"] = gap
    if entropy_regularised:
        metrics["epo/entropy_coef"] = s.entropy_coef
    if s.smoothing:
        metrics["epo/beta"] = s.beta
    if (s.smoothing or entropy_regularised) and s.entropy_ref is not None:
        metrics["epo/entropy_ref"] = s.entropy_ref
        metrics["epo/out_of_range_frac"] = float(total["out_of_range"] / total["entropy"][1])
    for i, name in enumerate(PANELS):
        if (value := ratio(total["panels"][2 * i : 2 * i + 2])) is not None:
            metrics[f"entropy/{name}"] = value
    if "critic" in total:
        metrics["critic/return_mean"], metrics["critic/value_mean"] = critic_means_from_moments(total["critic"])
        if torch.isfinite(ev := explained_variance_from_moments(total["critic"])):
            metrics["critic/explained_variance"] = float(ev)
    return metrics
