"""The LightningModule: actor (+ critic for PPO, + frozen reference for KL: with LoRA the actor's own frozen base)
and one RL step's update.

One ``training_step`` = one RL step k: old-policy pass (no grad) -> advantages -> PPO epochs over
mini-batches of micro-batches -> ``L_MT - lambda [L_H - beta_k L_smooth]`` (Appendix C).

Departures from the paper / reference code (all configurable, paper default first):
- L_MT is aggregated like Eq. 4 by default; ``algo.loss_agg=token`` gives verl's flat token mean,
  ``seq_sum_norm`` Dr. GRPO's token sum over a constant (``algo=drgrpo``).
- Eq. 5 is the differentiable hinge; ``algo.epo.penalty=indicator`` is the reference code's constant.
- Aggregation weights are fixed once per RL step over all ranks, so micro-batching, mini-batching
  and data parallelism never change the loss (the reference code normalised per micro-batch).
- Gradient clipping is per parameter group (actor, critic), as verl clips each model on its own; under
  DeepSpeed the engine clips (its config's ``gradient_clipping``, over all parameters).
- An optimizer step whose loss or gradient norm is not finite (on any rank) is skipped and counted
  (``train/skipped_steps``), DeepSpeed's steps included; ``optim.max_skipped_streak`` skipped steps in a
  row stop the run.
- Divergence that a finite loss hides also stops the run before the RL step is checkpointed (the last
  checkpoint stays the last good state, and the error names it): non-finite old-policy log-probs, entropies
  or values (so the entropy window never takes a non-finite entry), a parameter norm (actor, critic) that is
  not finite or grew more than ``optim.max_param_norm_growth`` times in the RL step's update, and sampling
  logits that are not finite (the hf engine).
- A resumed run trains at the configured ``optim.actor_lr`` / ``critic_lr`` (on the restored schedule), not
  at the checkpoint's, so that "lower the lr and resume" does what it says.
- Python, NumPy and torch are reseeded at every RL step from ``(seed, k, rank)`` (lightning_epo/core/seeding.py).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Iterator

import hydra
import lightning as L
import torch
import torchmetrics
from omegaconf import DictConfig, OmegaConf

from lightning_epo.algos import (
    ADVANTAGES,
    AdvantageInputs,
    entropy_coef_at,
    entropy_shaped_advantage,
    out_of_range,
    sequence_sum_weights,
    token_mean_weights,
    trajectory_weights,
    whiten,
)
from lightning_epo.algos.aggregation import turn_and_trajectory_counts
from lightning_epo.algos.losses import explained_variance_from_moments, explained_variance_moments
from lightning_epo.algos.objective import ObjectiveSettings, StepTargets, epo_objective
from lightning_epo.core.errors import TrainingDiverged
from lightning_epo.core.metric_names import (
    EVAL_EPISODES, LOSS_TERMS, PANELS, PROGRESS_BAR, ROLLOUT_COUNTS, STEP_PARTS, VAL_METRICS,
)
from lightning_epo.core.secrets import scrub_secrets
from lightning_epo.core.seeding import seed_rl_step
from lightning_epo.models.loading import load_actor, load_critic, load_reference, uses_reference
from lightning_epo.models.lora import is_lora
from lightning_epo.models.policy_outputs import actor_token_outputs
from lightning_epo.models.shards import local_values
from lightning_epo.models.shared_prefix import Sharing, prefix_hosts, shared_prefix_length
from lightning_epo.rollout.batch import RolloutBatch
from lightning_epo.training.checkpoint_io import finished_steps, newest_checkpoint, reopen_finished_run
from lightning_epo.training.distributed import accumulation_boundary, hf_zero3_config, is_deepspeed, zero_stage
from lightning_epo.training.entropy_panels import entropy_panel_sums
from lightning_epo.training.optim import build_optimizer, build_scheduler
from lightning_epo.training.step_clock import StepClock, matmul_peak_flops, model_flops_per_token, step_line
from lightning_epo.training.step_io import StepInputs, StepReport
from lightning_epo.training.step_metrics import RankSums, ratio, turn_entropy_sums, turn_means

__all__ = ["EPOModule", "TrainingDiverged"]

log = logging.getLogger(__name__)


class EPOModule(L.LightningModule):
    """Holds the models and all the math; never touches an environment."""

    def __init__(
        self,
        model: DictConfig,
        algo: DictConfig,
        optim: DictConfig,
        total_steps: int,
        eval_splits: list[str],
        seed: int = 0,
        train_temperature: float = 1.0,
        edge_turns: int = 2,
        edge_tokens: int = 10,
        max_turns: int = 50,
        state_settings: Mapping[str, Any] | None = None,
    ) -> None:
        """``state_settings``: the run's settings that fix its checkpoint's state (lightning_epo/runtime/
        state_settings.py), recorded in every checkpoint for a resume to compare (None: none recorded)."""
        super().__init__()
        # plain containers in the checkpoint: Lightning resumes with torch.load(weights_only=True)
        model, algo, optim = (OmegaConf.to_container(c, resolve=True) for c in (model, algo, optim))
        eval_splits = list(eval_splits)
        # Lightning collects the init arguments, then keeps them scrubbed: the checkpoint and every logger get them
        # (the models load from the unscrubbed ``model`` below, e.g. with its hub token)
        self.save_hyperparameters(ignore=["state_settings"])  # the checkpoint holds them apart (on_save_checkpoint)
        self.save_hyperparameters(scrub_secrets(dict(self.hparams)))
        # plain too (Hydra's instantiate hands the dict over as a DictConfig)
        self.state_settings = None if state_settings is None else OmegaConf.to_container(OmegaConf.create(state_settings))
        self.automatic_optimization = False
        self.model_cfg, self.algo, self.optim_cfg = (OmegaConf.create(c) for c in (model, algo, optim))
        self.fixed_settings = self._objective_settings()
        self.actor: torch.nn.Module | None = None
        self.critic: torch.nn.Module | None = None
        self.reference: torch.nn.Module | None = None
        self.rl_step = 0
        self.skipped_steps = 0
        self.skip_streak = 0  # skipped optimizer steps in a row
        self._hf_zero3_config: Any = None  # kept alive while ZeRO-3 loads (transformers holds a weak reference)
        self.step_inputs = StepInputs()  # filled by the callbacks before each RL step (lightning_epo/training/step_io.py)
        self.step_report: StepReport | None = None  # published after each RL step, for the callbacks
        self.clock = StepClock(torch.device("cpu"))  # the running RL step's parts, timed by the module and callbacks
        self.eval_s = 0.0  # the running evaluation's collection time, summed over its splits
        self.val_metrics = torch.nn.ModuleDict(
            {
                **{f"{split}_{name}": torchmetrics.MeanMetric() for split in eval_splits for name in VAL_METRICS},
                **{f"{split}_episodes": torchmetrics.SumMetric() for split in eval_splits},  # over batches and ranks
            }
        )

    # ----------------------------------------------------------------- models and optimizer
    def configure_model(self) -> None:
        """Load the models here (not in ``__init__``) so sharded strategies can build them in place."""
        if self.actor is not None:
            return
        self._hf_zero3_config = hf_zero3_config(self.trainer.strategy) if self._trainer is not None else None
        self.actor = load_actor(self.model_cfg).train()
        if self.algo.critic:
            self.critic = load_critic(self.model_cfg).train()
        if uses_reference(self.model_cfg, self.algo.kl_coef):  # with LoRA the reference is the adapter-free base
            self.reference = load_reference(self.model_cfg)

    def teardown(self, stage: str) -> None:
        self._hf_zero3_config = None  # the run is over: later loads in this process are not ZeRO-3's

    def configure_optimizers(self) -> Any:
        opt = build_optimizer(
            hydra.utils.instantiate(self.optim_cfg.optimizer),
            self.actor,
            self.critic,
            self.optim_cfg.actor_lr,
            self.optim_cfg.critic_lr,
        )
        sched = build_scheduler(opt, self.hparams.total_steps, self.optim_cfg.warmup_ratio, self.optim_cfg.min_lr_ratio)
        return [opt], [sched]

    # ----------------------------------------------------------------- helpers
    def _reduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """``t`` reduced over all ranks (``sum`` or ``max``); itself on a single process."""
        return self.trainer.strategy.reduce(t, reduce_op=op) if self.trainer.world_size > 1 else t

    def _micro_batches(self, batch: RolloutBatch, groups: list[torch.Tensor]) -> list[list[torch.Tensor]]:
        """Each of ``groups`` (row indices of ``batch``) cut into micro-batches: of at most ``algo.micro_batch_size``
        rows, or with ``algo.micro_batch_tokens`` sorted by length and packed up to that many tokens of padded size
        (:meth:`RolloutBatch.split_by_tokens`). With ``model.fold_turns`` the rows cut are the group's hosts
        (:func:`prefix_hosts`, the rows the decoders compute) and each row joins its host's
        micro-batch. As many micro-batches as the rank that needs the most (here some may be empty, see
        :meth:`_rows_or_first`): DDP and DeepSpeed reduce gradients in every backward pass and every ZeRO-3 forward
        all-gathers the parameter shards, so all ranks must run the same number of passes."""
        fold = self.model_cfg.get("fold_turns", False)
        hosts = [rows[prefix_hosts(batch.input_ids[rows], batch.attention_mask[rows])] if fold else rows
                 for rows in groups]  # [n] per group: batch indices
        computed = [group_hosts.unique() if fold else rows for rows, group_hosts in zip(groups, hosts)]
        budget = self.algo.get("micro_batch_tokens")
        if budget is None:  # rows spread evenly over the passes
            counts = self._most_passes([math.ceil(len(rows) / self.algo.micro_batch_size) for rows in computed])
            cuts = [list(rows.tensor_split(count)) for rows, count in zip(computed, counts)]
        else:
            cuts = [batch.split_by_tokens(rows, budget) for rows in computed]
            counts = self._most_passes([len(cut) for cut in cuts])
            cuts = [cut + [rows[:0]] * (count - len(cut)) for rows, cut, count in zip(computed, cuts, counts)]
        if not fold:
            return cuts
        return [[rows[torch.isin(group_hosts, cut)] for cut in group_cuts]  # each row beside its host
                for rows, group_hosts, group_cuts in zip(groups, hosts, cuts)]

    def _most_passes(self, local: list[int]) -> list[int]:
        """The largest of each of this rank's pass counts ``local`` over all ranks (at least 1)."""
        return self._reduce(torch.tensor(local, device=self.device), "max").clamp(min=1).tolist()

    def _rows_or_first(self, rows: torch.Tensor) -> torch.Tensor:
        """``rows``, or row 0 for an empty micro-batch: a pass whose result is discarded (or weighted 0), run so
        that this rank takes part in the other ranks' collectives."""
        return rows if len(rows) else torch.zeros(1, dtype=torch.long, device=self.device)

    def _objective_settings(self) -> ObjectiveSettings:
        """The objective's settings fixed for the whole run (λ_k, β_k and H̄ are set per step by :meth:`_settings`)."""
        epo, algo = self.algo.epo, self.algo
        return ObjectiveSettings(
            entropy_coef=0.0, beta=0.0, entropy_ref=None, smoothing=bool(epo.enabled and epo.smoothing),
            kappa_l=epo.kappa_l, kappa_r=epo.kappa_r, alpha=epo.alpha, penalty=epo.penalty,
            policy_loss=algo.policy_loss, clip_low=algo.clip_low, clip_high=algo.clip_high, dual_clip=algo.dual_clip,
            value_coef=algo.value_coef, value_clip=algo.value_clip, kl_coef=algo.kl_coef, kl_estimator=algo.kl_estimator,
        )

    def _settings(self) -> ObjectiveSettings:
        """RL step k's settings: the fixed ones with λ_k (the entropy-weight schedule), β_k and H̄ (the callbacks')."""
        inputs = self.step_inputs
        if self.fixed_settings.smoothing and (inputs.beta is None or inputs.window_len is None):
            raise RuntimeError(
                f"algo {self.algo.name} smooths entropy (Eq. 6) but no entropy window / beta_k schedule ran: "
                "use callbacks=default (EntropyWindow and BetaSchedule)"
            )
        return replace(
            self.fixed_settings,
            entropy_coef=entropy_coef_at(self.rl_step, self.hparams.total_steps, self.algo.entropy_coef, self.algo.entropy_decay),
            beta=inputs.beta or 0.0,
            entropy_ref=inputs.entropy_ref,
        )

    def _sharing(self, mb: RolloutBatch) -> Sharing:
        """What the decoders compute once in ``mb``: with ``model.fold_turns`` only the rows that begin no other
        (:func:`prefix_hosts`), with ``model.shared_prefix`` the leading tokens of those rows (0 for
        one row: nothing to share). Every ZeRO-3 forward all-gathers the parameter shards, so there all ranks must
        run the decoder as many times (two passes with a prefix, one without): a prefix is used only where every
        rank has one. Folding changes no pass count."""
        folded = Sharing()
        if self.model_cfg.get("fold_turns", False):
            hosts = prefix_hosts(mb.input_ids, mb.attention_mask)
            if not bool((hosts == torch.arange(len(mb), device=hosts.device)).all()):  # else nothing folds: no gather
                folded = Sharing.from_hosts(hosts)
        if not self.model_cfg.get("shared_prefix", False):
            return folded
        rows = slice(None) if folded.computed is None else folded.computed
        ids, mask = mb.input_ids[rows], mb.attention_mask[rows]
        prefix = shared_prefix_length(ids, mask) if len(ids) > 1 else 0
        zero3 = self._trainer is not None and zero_stage(self.trainer.strategy) == 3
        if zero3 and self._reduce(torch.tensor(int(prefix > 0), device=self.device), "min") == 0:
            prefix = 0
        return replace(folded, prefix=prefix)

    def _token_outputs(
        self, mb: RolloutBatch, sharing: Sharing, model: torch.nn.Module | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs and entropies ``[n, L]`` of ``mb``'s response tokens under ``model`` (the actor by default),
        its shared tokens computed once (:meth:`_sharing`)."""
        return actor_token_outputs(
            model if model is not None else self.actor,
            mb.input_ids,
            mb.attention_mask,
            mb.response_mask,
            self.model_cfg.get("logits_chunk_size"),
            self.hparams.train_temperature,
            sharing,
        )

    def _reference_logprobs(self, mb: RolloutBatch, sharing: Sharing) -> torch.Tensor:
        """``mb``'s response log-probs under the frozen reference: the reference model, or with LoRA the actor
        with its adapter disabled (the same frozen base)."""
        if self.reference is not None:
            return self._token_outputs(mb, sharing, self.reference)[0]
        with self.actor.disable_adapter():
            return self._token_outputs(mb, sharing)[0]

    # ----------------------------------------------------------------- old-policy pass
    @torch.no_grad()
    def _old_policy_pass(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        """Old log-probs, token entropies, values and reference log-probs, all ``[N, L]``."""
        shape = batch.input_ids.shape
        out = {"old_logprobs": torch.zeros(shape, device=self.device), "entropy": torch.zeros(shape, device=self.device)}
        if self.critic is not None:
            out["old_values"] = torch.zeros(shape, device=self.device)
        if self.algo.kl_coef > 0:
            out["ref_logprobs"] = torch.zeros(shape, device=self.device)
        (micro_batches,) = self._micro_batches(batch, [torch.arange(len(batch), device=self.device)])
        for rows in micro_batches:
            mb = batch.select(self._rows_or_first(rows))
            length, sharing = mb.input_ids.shape[1], self._sharing(mb)
            with self.clock.part("old_logprob"):
                outputs = dict(zip(("old_logprobs", "entropy"), self._token_outputs(mb, sharing)))
            if self.critic is not None:
                with self.clock.part("values"):
                    outputs["old_values"] = self.critic(mb.input_ids, mb.attention_mask, sharing)
            if "ref_logprobs" in out:
                with self.clock.part("ref_logprob"):
                    outputs["ref_logprobs"] = self._reference_logprobs(mb, sharing)
            for name, value in outputs.items():
                out[name][rows, :length] = value[: len(rows)]
        return out

    def _advantages(self, batch: RolloutBatch, old: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
        mask = batch.response_mask
        inputs = AdvantageInputs(
            mask=mask,
            turn_rewards=batch.turn_rewards,
            episode_returns=batch.episode_returns,
            traj_ids=batch.traj_ids,
            turn_idx=batch.turn_idx,
            group_ids=batch.group_ids,
            values=old.get("old_values"),
            state_ids=batch.state_ids,
        )
        advantages, returns = ADVANTAGES.get(self.algo.advantage)(inputs, **self.algo.get(self.algo.advantage, {}))
        if self.algo.whiten_advantages:
            advantages = whiten(advantages, mask, self._reduce)
        if self.algo.get("advantage_shaping"):
            shaping = self.algo.advantage_shaping
            advantages = entropy_shaped_advantage(advantages, old["entropy"], shaping.alpha, shaping.kappa) * mask
        return advantages, returns

    def _step_targets(self, batch: RolloutBatch, old: dict[str, torch.Tensor]) -> StepTargets:
        """Everything fixed for the RL step, with aggregation weights over all ranks."""
        mask, traj_ids = batch.response_mask, batch.traj_ids
        tokens, _, local_b = turn_and_trajectory_counts(mask, traj_ids)
        counts = [local_b, tokens.sum(), (tokens > 0).sum()]  # trajectories, tokens, turns with tokens
        totals = self._reduce(torch.tensor([float(c) for c in counts], device=self.device)).long().tolist()
        traj_w = trajectory_weights(mask, traj_ids, totals[0])
        agg = self.algo.loss_agg
        mean_w = traj_w if agg == "trajectory" else token_mean_weights(mask, totals[1])
        pg_w = sequence_sum_weights(mask, self.algo.loss_scale_factor, totals[2]) if agg == "seq_sum_norm" else mean_w
        advantages, returns = self._advantages(batch, old)
        return StepTargets(
            old_logprobs=old["old_logprobs"],
            advantages=advantages,
            pg_weights=pg_w,
            traj_weights=traj_w,
            mean_weights=mean_w,
            returns=returns,
            old_values=old.get("old_values"),
            ref_logprobs=old.get("ref_logprobs"),
        )

    # ----------------------------------------------------------------- the update
    def _ppo_update(self, batch: RolloutBatch, targets: StepTargets, settings: ObjectiveSettings) -> tuple[dict[str, float], int]:
        """``ppo_epochs`` passes over ``mini_batches`` optimizer steps, each accumulating micro-batches.

        A mini-batch's loss is scaled by ``mini_batches * world_size``: its tokens' fixed weights sum to
        about ``1 / mini_batches`` of the RL step's, and DDP / DeepSpeed average gradients over ranks.
        Every rank runs the same number of optimizer steps and of backward passes per step (the largest
        micro-batch count of any rank, see lightning_epo/training/distributed.py), so collectives always pair up.

        With ``algo.target_kl`` set, the update stops early (as in Stable-Baselines3's PPO) at the first
        mini-batch whose approximate KL to the old policy (all ranks) exceeds ``1.5 * target_kl``, without
        applying that mini-batch's step. Returns the loss terms averaged over the mini-batches that ran
        (each as a full-batch value) and the number of optimizer steps taken.
        """
        opt = self.optimizers()
        generator = torch.Generator().manual_seed(self.hparams.seed * 100_003 + self.rl_step)
        scale = self.algo.mini_batches * self.trainer.world_size
        sums: dict[str, float] = {}
        ran = steps = 0
        for _ in range(self.algo.ppo_epochs):
            order = torch.randperm(len(batch), generator=generator).to(self.device)
            minis = order.tensor_split(self.algo.mini_batches)
            for mini, micro_batches in zip(minis, self._micro_batches(batch, minis)):
                opt.zero_grad()
                kl_before = sums.get("approx_kl", 0.0)
                for i, rows in enumerate(micro_batches):
                    with accumulation_boundary(self.trainer.strategy, last=i == len(micro_batches) - 1):
                        self._accumulate(batch, targets, settings, rows, scale, sums)
                ran += 1
                if self._kl_exceeded(sums["approx_kl"] - kl_before, targets.mean_weights[mini].sum()):
                    opt.zero_grad()
                    return self._mean_terms(sums, ran), steps
                self._clip_and_step(opt)
                steps += 1
        return self._mean_terms(sums, ran), steps

    def _kl_exceeded(self, weighted_kl: float, weight: torch.Tensor) -> bool:
        """Whether this mini-batch's approximate KL (its ``mean_weights``-weighted mean over all ranks) exceeds
        ``1.5 * algo.target_kl``; always False without a target."""
        target = self.algo.get("target_kl")
        if target is None:
            return False
        kl, total = self._reduce(torch.tensor([weighted_kl, float(weight)], device=self.device)).tolist()
        return total > 0 and kl / total > 1.5 * target

    def _mean_terms(self, sums: dict[str, float], minis_run: int) -> dict[str, float]:
        """Summed mini-batch terms -> their mean full-batch value (a mini-batch holds ~1/mini_batches of it)."""
        return {name: value * self.algo.mini_batches / minis_run for name, value in sums.items()}

    def _accumulate(
        self, batch: RolloutBatch, targets: StepTargets, settings: ObjectiveSettings, rows: torch.Tensor,
        scale: float, sums: dict[str, float],
    ) -> None:
        """Backward of the micro-batch ``rows``, adding its terms to ``sums``. An empty micro-batch runs a
        zero-weight pass on row 0 (:meth:`_rows_or_first`). A loss that is not finite makes every gradient of
        the pass NaN (even where its gradients were finite), so that the step's gradient-norm check skips it
        on every rank: the module's own, or DeepSpeed's over all ranks (:meth:`_clip_and_step`)."""
        weight = 1.0 if len(rows) else 0.0
        rows = self._rows_or_first(rows)
        mb = batch.select(rows)
        length, sharing = mb.input_ids.shape[1], self._sharing(mb)
        mb_targets = targets.select(rows, length)
        logprob, entropy = self._token_outputs(mb, sharing)
        values = self.critic(mb.input_ids, mb.attention_mask, sharing) if self.critic is not None else None
        loss, terms = epo_objective(logprob, entropy, values, mb_targets, settings)
        poison = torch.where(torch.isfinite(loss.detach()), 1.0, float("nan"))  # 1, or NaN for a non-finite loss
        self.manual_backward(loss * (scale * weight) * poison)
        for name, value in terms.items():
            sums[name] = sums.get(name, 0.0) + weight * float(value)

    def _clip_and_step(self, opt: Any) -> None:
        """Clip each parameter group on its own and step; skip (and count) a step whose gradient norm is not
        finite (after DDP's average over ranks, so on every rank alike; a non-finite loss makes it so, see
        :meth:`_accumulate`). Under DeepSpeed the engine owns the step: it clips over all parameters and skips
        a step whose gradient norm over all ranks is not finite, in fp32 and bf16 alike; the count follows
        what it did."""
        if is_deepspeed(self.trainer.strategy):
            opt.step()
            skipped = not self.trainer.strategy.deepspeed_engine.was_step_applied()
        else:
            norms = [
                torch.nn.utils.clip_grad_norm_(group["params"], self.optim_cfg.grad_clip)
                for group in opt.optimizer.param_groups
            ]
            skipped = not all(torch.isfinite(n) for n in norms)
            if not skipped:
                opt.step()
        opt.zero_grad()
        self._count_skip(skipped)

    def _count_skip(self, skipped: bool) -> None:
        """Track skipped optimizer steps; stop the run (before this RL step is checkpointed) after
        ``optim.max_skipped_streak`` in a row (null: never)."""
        self.skipped_steps += int(skipped)
        self.skip_streak = self.skip_streak + 1 if skipped else 0
        limit = self.optim_cfg.get("max_skipped_streak")
        if limit is not None and self.skip_streak >= limit:
            raise self._diverged(
                f"{self.skip_streak} optimizer steps in a row had a non-finite loss or gradient norm "
                "(or raise optim.max_skipped_streak)"
            )

    def _diverged(self, reason: str) -> TrainingDiverged:
        """The one-line error that stops the run in RL step k before k is checkpointed: ``reason`` and the
        checkpoint to resume from, the newest one on disk (the last good state: nothing later was saved)."""
        callback = self.trainer.checkpoint_callback
        newest = newest_checkpoint(callback.dirpath if callback is not None else None)
        resume = f"resume with ckpt_path={newest}" if newest is not None else "start again (no checkpoint exists yet)"
        return TrainingDiverged(
            f"training diverged at RL step {self.rl_step}: {reason}. Stopped without checkpointing this step: "
            f"lower optim.actor_lr / optim.critic_lr and {resume}"
        )

    @torch.no_grad()
    def _param_norms(self) -> torch.Tensor:
        """L2 norms of the actor's and (with one) the critic's trainable parameters, ``[1 or 2]`` (fp32): one
        norm per parameter, no copy of the weights. ZeRO-3's shards are summed (as squares) over all ranks."""
        squares = []
        for model in (self.actor, self.critic):
            if model is not None:
                params = [local_values(p) for p in model.parameters() if p.requires_grad]
                squares.append(torch.stack([torch.linalg.vector_norm(p).float() for p in params]).square().sum())
        squares = torch.stack(squares)
        return (self._reduce(squares) if zero_stage(self.trainer.strategy) == 3 else squares).sqrt()

    def _check_parameters(self, before: torch.Tensor) -> None:
        """Stop the run if this RL step's update left a parameter norm (``_param_norms``, ``before`` the update)
        non-finite or more than ``optim.max_param_norm_growth`` times larger (null: only non-finite stops)."""
        after = self._param_norms()
        growth = self.optim_cfg.get("max_param_norm_growth")
        if not torch.isfinite(after).all():
            raise self._diverged("parameter norm not finite after the update")
        if growth is not None and bool((after > growth * before).any()):
            ratios = ", ".join(f"{name} {float(a / b):.3g}x" for name, a, b in zip(("actor", "critic"), after, before))
            raise self._diverged(
                f"parameter norm grew in one update ({ratios}), more than optim.max_param_norm_growth={growth}"
            )

    def _check_old_policy(self, old: dict[str, torch.Tensor], mask: torch.Tensor) -> None:
        """Stop the run (every rank alike) if the old-policy pass gave a non-finite log-prob, entropy or value on
        a response token: the weights have diverged, and the entropy window must not take the step's mean."""
        names = [name for name in ("old_logprobs", "entropy", "old_values") if name in old]
        bad = int(self._reduce(torch.stack([(~torch.isfinite(old[name][mask])).sum() for name in names]).sum().float()))
        if bad:
            raise self._diverged(f"the old-policy pass gave {bad} non-finite log-probs, entropies or values")

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """Reseed for RL step k on this rank, before its rollout is collected (lightning_epo/core/seeding.py), and
        start the step's clock."""
        seed_rl_step(self.hparams.seed, self.rl_step, self.global_rank)
        self.clock = StepClock(self.device)

    def on_train_start(self) -> None:
        """Train at the configured learning rates, on resume too: Lightning restores the optimizer's and the LR
        scheduler's rates from the checkpoint, so "lower optim.actor_lr and resume" would keep the old one. The
        restored schedule position is kept; with an unchanged config this rewrites the values already there
        (the scheduler's own ``base_lr * factor(k)``), so an exact resume stays exact."""
        scheduler = self.lr_schedulers()
        configured = {"actor": self.optim_cfg.actor_lr, "critic": self.optim_cfg.critic_lr}
        scheduler.base_lrs = [configured[group["name"]] for group in scheduler.optimizer.param_groups]
        for group, base_lr, factor in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
            group["initial_lr"], group["lr"] = base_lr, base_lr * factor(scheduler.last_epoch)

    def on_train_epoch_start(self) -> None:
        if self.reference is not None:  # Lightning's module.train() must not wake the frozen reference
            self.reference.eval()

    def training_step(self, dataloader_iter: Iterator) -> None:
        """One RL step. Takes the iterator (not a batch) so Lightning cannot prefetch the next rollout
        with the old weights: the next batch is collected only after this update."""
        try:
            batch, _, _ = next(dataloader_iter)
        except TrainingDiverged as error:  # the engine sampled from non-finite logits: name the checkpoint
            raise self._diverged(str(error)) from error
        batch = batch.to(self.device)
        old = self._old_policy_pass(batch)
        mask = batch.response_mask
        self._check_old_policy(old, mask)
        settings = self._settings()
        targets = self._step_targets(batch, old)
        norms_before = self._param_norms()
        with self.clock.part("update"):
            terms, optimizer_steps = self._ppo_update(batch, targets, settings)
        self._check_parameters(norms_before)
        self.lr_schedulers().step()
        self.step_report = self._log_step(batch, old, targets, terms, settings, optimizer_steps=optimizer_steps)
        self.rl_step += 1

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Log where RL step k's time went and say it in one line: Lightning calls this after every callback's
        hook, so the weight push and the checkpoint are in."""
        self._log_perf(self.step_report.rollout)

    def _update_flops(self, batch: RolloutBatch) -> float:
        """The update's model FLOPs (:func:`model_flops_per_token`): every epoch a forward and a backward of each
        model over the batch's real tokens, the actor's output layer over its response tokens. A backward costs two
        forwards where the weights train, one where they are frozen (LoRA's base: input gradients only)."""
        tokens, responses = float(batch.attention_mask.sum()), float(batch.response_mask.sum())
        models = [(self.actor, self.actor, responses)]
        if self.critic is not None:
            models.append((self.critic, self.critic.backbone, 0.0))
        flops = 0.0
        for model, decoder, logits in models:
            body, output = model_flops_per_token(decoder)
            flops += (2.0 if is_lora(model) else 3.0) * (body * tokens + output * logits)
        return flops * self.algo.ppo_epochs

    # ----------------------------------------------------------------- logging
    def _log(self, name: str, value: float) -> None:
        """Log a value already equal on every rank (all-rank sums come from :meth:`_log_step`'s one reduction)."""
        self.log(name, float(value), on_step=True, on_epoch=False, batch_size=1, prog_bar=name in PROGRESS_BAR)

    def _log_step(
        self, batch: RolloutBatch, old: dict[str, torch.Tensor], targets: StepTargets, terms: dict[str, float],
        s: ObjectiveSettings, optimizer_steps: int,
    ) -> StepReport:
        """Log RL step k's metrics (DESIGN.md's table; names in lightning_epo/core/metric_names.py) and return its
        report for the callbacks. Every quantity summed over ranks goes through one collective; a metric that
        does not exist in this run (no critic, no smoothing, no tokens in a panel) is not logged."""
        mask, entropy = batch.response_mask, old["entropy"]
        sums = RankSums(self.device)
        for name, value in [*batch.stats.items(), *((f"terms/{n}", v) for n, v in terms.items())]:
            sums.add(name, value)
        sums.add("entropy", torch.stack([entropy[mask].sum(), mask.sum().float()]))
        sums.add("panels", entropy_panel_sums(entropy, mask, batch.traj_ids, batch.turn_idx,
                                              self.hparams.edge_turns, self.hparams.edge_tokens))
        sums.add("turns", turn_entropy_sums(entropy, mask, batch.turn_idx, self.hparams.max_turns))
        if s.smoothing and s.entropy_ref is not None:
            sums.add("out_of_range", out_of_range(entropy[mask], s.entropy_ref, s.kappa_l, s.kappa_r).sum())
        if targets.returns is not None:  # the old critic against the targets it is trained on this step
            sums.add("critic", explained_variance_moments(targets.returns, targets.old_values, mask))
        total, world = sums.reduce(self._reduce), self.trainer.world_size

        for name in batch.stats:  # per-rank rollout stats: counts add up, rates average
            self._log(name, total[name] if name in ROLLOUT_COUNTS else total[name] / world)
        for name in LOSS_TERMS:
            if name in terms:
                self._log(f"loss/{name}", total[f"terms/{name}"])
        self._log("ppo/clipfrac", total["terms/clipfrac"])
        self._log("ppo/approx_kl", total["terms/approx_kl"])
        if self.algo.get("target_kl") is not None:  # without a target it is always ppo_epochs * mini_batches
            self._log("ppo/optimizer_steps", optimizer_steps)
        self._log("train/lr", self.lr_schedulers().get_last_lr()[0])
        self._log("train/skipped_steps", self.skipped_steps)
        if self.algo.epo.enabled:
            self._log("epo/entropy_coef", s.entropy_coef)
        if s.smoothing:
            self._log("epo/beta", s.beta)
            if s.entropy_ref is not None:
                self._log("epo/entropy_ref", s.entropy_ref)
                self._log("epo/out_of_range_frac", total["out_of_range"] / total["entropy"][1])
        for i, name in enumerate(PANELS):
            if (value := ratio(total["panels"][2 * i : 2 * i + 2])) is not None:
                self._log(f"entropy/{name}", value)
        if "critic" in total and torch.isfinite(ev := explained_variance_from_moments(total["critic"])):
            self._log("critic/explained_variance", ev)  # undefined when the returns do not vary: not logged
        return StepReport(
            rl_step=self.rl_step, entropy_mean=ratio(total["entropy"]) or 0.0,
            turn_entropy=turn_means(total["turns"].view(2, -1)), rollout=batch,
        )

    def _log_perf(self, batch: RolloutBatch) -> None:
        """Log RL step k's ``perf/*`` timings (:mod:`lightning_epo.training.step_clock`; the rollout's parts are
        logged with the rollout's metrics) as means over ranks, the update's achieved FLOP/s and its share of the
        matmul peak, and on CUDA the step's peak memory on the fullest GPU; rank 0 says them in one line."""
        seconds = {f"perf/{part}_s": self.clock.seconds[part] for part in STEP_PARTS if part in self.clock.seconds}
        seconds["perf/step_s"] = self.clock.elapsed()
        total = self._reduce(torch.tensor(list(seconds.values()), device=self.device)) / self.trainer.world_size
        seconds = dict(zip(seconds, total.tolist()))
        for name, value in seconds.items():
            self._log(name, value)
        flops_per_s = self._update_flops(batch) / max(seconds["perf/update_s"], 1e-9)
        dtype = torch.bfloat16 if "bf16" in str(self.trainer.precision) else next(self.actor.parameters()).dtype
        peak = matmul_peak_flops(self.device.type, dtype)
        self._log("perf/update_flops_per_s", flops_per_s)
        self._log("perf/update_peak_share", flops_per_s / peak)
        if self.device.type == "cuda":  # the RL step's peak on the fullest GPU: its rollout and its update
            memory = torch.tensor(float(torch.cuda.max_memory_allocated(self.device)), device=self.device)
            self._log("perf/peak_memory_gib", self._reduce(memory, "max") / 2**30)
            torch.cuda.reset_peak_memory_stats(self.device)
        if self.global_rank == 0:
            log.info(step_line(self.rl_step - 1, {**batch.stats, **seconds}, flops_per_s, peak))

    # ----------------------------------------------------------------- validation
    def on_validation_epoch_start(self) -> None:
        """Fresh metric states made in this evaluation's grad mode: a ``trainer.validate`` before ``fit``
        (``val_at_start``) leaves inference-mode tensors that fit's validation could not update in place. They are
        made on the module's device: ZeRO-3 moves only the parameters there, and the metrics' all-rank sync (NCCL on
        a GPU) needs their states beside them."""
        self.val_metrics.to(self.device)
        for metric in self.val_metrics.values():
            metric.reset()
        self.eval_s = 0.0

    def on_validation_epoch_end(self) -> None:
        """Log the evaluation's collection time (every split's, this rank's: ranks play their shares at once)."""
        self.log("perf/eval_s", self.eval_s, on_step=False, on_epoch=True, batch_size=1)

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """``batch`` is an evaluation batch of finished episodes of one split (collected at val temperature)."""
        self.eval_s += batch.wall_s
        self.val_metrics[f"{batch.split}_episodes"].update(float(len(batch.episodes)))
        for ep in batch.episodes:
            self.val_metrics[f"{batch.split}_success"].update(float(ep.won))
            self.val_metrics[f"{batch.split}_reward"].update(ep.episode_return)
            self.val_metrics[f"{batch.split}_turns"].update(ep.num_turns)
            if ep.num_turns:  # per-turn means: each episode weighted by its turns
                tokens = sum(len(turn.response_ids) for turn in ep.turns)
                self.val_metrics[f"{batch.split}_invalid_action_rate"].update(ep.invalid_actions / ep.num_turns,
                                                                               ep.num_turns)
                self.val_metrics[f"{batch.split}_format_error_rate"].update(ep.format_errors / ep.num_turns,
                                                                             ep.num_turns)
                self.val_metrics[f"{batch.split}_response_tokens"].update(tokens / ep.num_turns, ep.num_turns)
        for name in VAL_METRICS:
            metric = self.val_metrics[f"{batch.split}_{name}"]
            self.log(f"val/{batch.split}/{name}", metric, on_step=False, on_epoch=True, add_dataloader_idx=False)
        self.log(EVAL_EPISODES.format(split=batch.split), self.val_metrics[f"{batch.split}_episodes"], on_step=False,
                 on_epoch=True, add_dataloader_idx=False)

    # ----------------------------------------------------------------- checkpoint state
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["rl_state"] = {
            "rl_step": self.rl_step, "skipped_steps": self.skipped_steps, "skip_streak": self.skip_streak,
        }
        if self.state_settings is not None:
            checkpoint["state_settings"] = self.state_settings

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Restore the RL step counters; a finished run resumed with a larger ``total_steps`` is reopened to train the
        steps beyond its own (runtime/config.py's ``check_resume`` said so at start)."""
        done = finished_steps(checkpoint)
        if done is not None and done < self.hparams.total_steps and self.trainer.state.fn == "fit":
            reopen_finished_run(checkpoint)
        state = checkpoint.get("rl_state", {})
        self.rl_step = state.get("rl_step", 0)
        self.skipped_steps = state.get("skipped_steps", 0)
        self.skip_streak = state.get("skip_streak", 0)
