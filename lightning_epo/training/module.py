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
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import replace
from typing import Any, Iterator

import hydra
import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf

from lightning_epo.algos import entropy_coef_at
from lightning_epo.algos.losses import past_target_kl
from lightning_epo.algos.objective import ObjectiveSettings, StepTargets, epo_objective
from lightning_epo.algos.step_targets import step_targets
from lightning_epo.core.errors import TrainingDiverged
from lightning_epo.core.metric_names import PROGRESS_BAR
from lightning_epo.core.secrets import scrub_secrets
from lightning_epo.core.seeding import seed_rl_step
from lightning_epo.models.loading import load_models
from lightning_epo.models.policy_outputs import actor_token_outputs
from lightning_epo.models.shared_prefix import Sharing
from lightning_epo.rollout.batch import RolloutBatch
from lightning_epo.training.checkpoint_io import reopen_if_extended
from lightning_epo.training.distributed import accumulation_boundary, hf_zero3_config, zero_stage
from lightning_epo.training.divergence_guard import DivergenceGuard, diverged_error, old_policy_not_finite, param_norms
from lightning_epo.training.eval_metrics import EvalMetrics
from lightning_epo.training.micro_batches import (
    filled_rows, micro_batch_sharing, plan_micro_batches, rows_or_first, step_mini_batches,
)
from lightning_epo.training.old_policy import old_policy_pass
from lightning_epo.training.optim import build_optimizer, build_scheduler, clip_and_step, use_configured_lrs
from lightning_epo.training.step_clock import StepClock, matmul_peak_flops, perf_metrics, step_line, update_flops
from lightning_epo.training.step_io import StepInputs, StepReport
from lightning_epo.training.step_log import step_metrics, step_sums
from lightning_epo.training.step_metrics import ratio, turn_means

__all__ = ["EPOModule", "TrainingDiverged"]

log = logging.getLogger(__name__)


class EPOModule(L.LightningModule):
    """Holds the models and all the math; never touches an environment."""

    def __init__(
        self, model: DictConfig, algo: DictConfig, optim: DictConfig, total_steps: int, eval_splits: list[str],
        seed: int = 0, train_temperature: float = 1.0, edge_turns: int = 2, edge_tokens: int = 10, max_turns: int = 50,
        state_settings: Mapping[str, Any] | None = None, eval_tasks: list[str] | None = None, eval_score: bool = False,
    ) -> None:
        """``state_settings``: the run's settings that fix its checkpoint's state (lightning_epo/runtime/
        state_settings.py), recorded in every checkpoint for a resume to compare; ``eval_*``: EvalMetrics'."""
        super().__init__()
        # plain containers in the checkpoint (Lightning resumes with torch.load(weights_only=True)); the arguments
        # Lightning collects are kept scrubbed for the checkpoint and the loggers (the models load from ``model``)
        model, algo, optim = (OmegaConf.to_container(c, resolve=True) for c in (model, algo, optim))
        eval_splits, eval_tasks = list(eval_splits), eval_tasks and [str(t) for t in eval_tasks]  # plain lists
        self.save_hyperparameters(ignore=["state_settings"])  # the checkpoint holds them apart (on_save_checkpoint)
        self.save_hyperparameters(scrub_secrets(dict(self.hparams)))
        self.state_settings = None if state_settings is None else OmegaConf.to_container(OmegaConf.create(state_settings))
        self.automatic_optimization = False
        self.model_cfg, self.algo, self.optim_cfg = (OmegaConf.create(c) for c in (model, algo, optim))
        self.fixed_settings = ObjectiveSettings.from_algo(self.algo)
        self.actor = self.critic = self.reference = None  # torch modules, loaded in configure_model
        self.rl_step = 0
        self.guard = DivergenceGuard(self.optim_cfg.get("max_skipped_streak"), self.optim_cfg.get("max_param_norm_growth"))
        self._hf_zero3_config: Any = None  # kept alive while ZeRO-3 loads (transformers holds a weak reference)
        self.step_inputs = StepInputs()  # filled by the callbacks before each RL step (lightning_epo/training/step_io.py)
        self.step_report: StepReport | None = None  # published after each RL step, for the callbacks
        self.clock = StepClock(torch.device("cpu"))  # the running RL step's parts, timed by the module and callbacks
        self.val_metrics = EvalMetrics(eval_splits, eval_tasks, eval_score)

    # ----------------------------------------------------------------- models and optimizer
    def configure_model(self) -> None:
        """Load the models here (not in ``__init__``) so sharded strategies can build them in place."""
        if self.actor is None:
            self._hf_zero3_config = hf_zero3_config(self.trainer.strategy) if self._trainer is not None else None
            self.actor, self.critic, self.reference = load_models(self.model_cfg, self.algo.critic, self.algo.kl_coef)

    def teardown(self, stage: str) -> None:
        self._hf_zero3_config = None  # the run is over: later loads in this process are not ZeRO-3's

    def configure_optimizers(self) -> Any:
        opt = build_optimizer(hydra.utils.instantiate(self.optim_cfg.optimizer), self.actor, self.critic,
                              self.optim_cfg.actor_lr, self.optim_cfg.critic_lr)
        sched = build_scheduler(opt, self.hparams.total_steps, self.optim_cfg.warmup_ratio, self.optim_cfg.min_lr_ratio)
        return [opt], [sched]

    # ----------------------------------------------------------------- one RL step, in the paper's order
    def training_step(self, dataloader_iter: Iterator) -> None:
        """One RL step k: old-policy pass (no grad) -> advantages -> PPO epochs -> β_k, H̄ and λ_k's step report.
        Takes the iterator (not a batch) so Lightning cannot prefetch the next rollout with the old weights: the
        next batch is collected only after this update."""
        try:
            batch = next(dataloader_iter)[0].to(self.device)
        except TrainingDiverged as error:  # the engine sampled from non-finite logits: name the checkpoint
            self._stop_if(str(error), error)
        seed = self.hparams.seed * 100_003 + self.rl_step
        minis, fills = step_mini_batches(batch.traj_ids, self.algo, seed)
        old = self._old_policy_pass(batch, filled_rows(minis, fills))
        settings = self._settings()
        targets = step_targets(batch.advantage_inputs(old.get("old_values")), old, self.algo, self._reduce)
        norms_before = self._param_norms()
        with self.clock.part("update", hand_back=True):  # its first `fills` mini-batches fill their rows' old outputs
            terms, optimizer_steps = self._ppo_update(batch, minis, targets, settings, old["entropy"], fills)
        self._stop_if(old_policy_not_finite(old, batch.response_mask, self._reduce))  # once the update filled its rows
        self._stop_if(self.guard.check_parameters(norms_before, self._param_norms()))
        self.lr_schedulers().step()
        self.step_report = self._log_step(batch, old["entropy"], targets, terms, settings, optimizer_steps)
        self.rl_step += 1

    def _old_policy_pass(self, batch: RolloutBatch, filled: torch.Tensor) -> dict[str, torch.Tensor]:
        """Old log-probs and entropies (but for the ``filled`` rows: the update's own forward gives those),
        values (with a critic) and reference log-probs (with KL), all ``[N, L]`` (training/old_policy.py)."""
        others = self.critic is not None or self.algo.kl_coef > 0
        return old_policy_pass(batch, filled, others, self._micro_batches, self._old_outputs, self._reduce)

    def _old_outputs(self, mb: RolloutBatch, actor: bool) -> dict[str, torch.Tensor]:
        """``mb``'s old log-probs and entropies (``actor``), else its values and reference log-probs, ``[n, L]``."""
        sharing, outputs = self._sharing(mb), {}
        if actor:
            with self.clock.part("old_logprob"):
                return dict(zip(("old_logprobs", "entropy"), self._token_outputs(mb, sharing)))
        if self.critic is not None:
            with self.clock.part("values"):
                outputs["old_values"] = self.critic(mb.input_ids, mb.attention_mask, sharing)
        if self.algo.kl_coef > 0:
            with self.clock.part("ref_logprob"):
                outputs["ref_logprobs"] = self._reference_logprobs(mb, sharing)
        return outputs

    def _settings(self) -> ObjectiveSettings:
        """RL step k's settings: the fixed ones with λ_k, and β_k and H̄ from the callbacks (required at start)."""
        inputs = self.step_inputs.required(self.fixed_settings.smoothing, self.algo.name)
        lambda_k = entropy_coef_at(self.rl_step, self.hparams.total_steps, self.algo.entropy_coef, self.algo.entropy_decay)
        return replace(self.fixed_settings, entropy_coef=lambda_k, beta=inputs.beta or 0.0, entropy_ref=inputs.entropy_ref)

    def _ppo_update(self, batch: RolloutBatch, minis: list[list[torch.Tensor]], targets: StepTargets,
                    settings: ObjectiveSettings, old_entropy: torch.Tensor, fills: int) -> tuple[dict[str, float], int]:
        """``ppo_epochs`` passes over ``mini_batches`` optimizer steps (``minis``: each epoch's rows), each accumulating
        micro-batches; a mini-batch's loss scaled by ``mini_batches * world_size`` (its weights sum to ~1/mini_batches
        of the step's; DDP / DeepSpeed average gradients over ranks). The first ``fills`` mini-batches write the old
        log-probs and entropies (``old_entropy`` ``[N, L]``) that the old pass left to them (micro_batches.py's
        ``update_fills``). With ``algo.target_kl`` the update stops
        at the first mini-batch past it, unapplied. Returns the loss terms' mean values and the optimizer steps."""
        opt, algo = self.optimizers(), self.algo

        mini_batches = ((mini, micro_batches) for epoch in minis  # (rows, their micro-batches), planned per epoch
                        for mini, micro_batches in zip(epoch, self._micro_batches(batch, epoch)))

        scale, target_kl = algo.mini_batches * self.trainer.world_size, algo.get("target_kl")
        sums: dict[str, float] = {}
        ran = steps = 0
        for mini, micro_batches in mini_batches:
            opt.zero_grad()
            kl_before, ran = sums.get("approx_kl", 0.0), ran + 1
            for i, rows in enumerate(micro_batches):
                with accumulation_boundary(self.trainer.strategy, last=i == len(micro_batches) - 1):
                    self._accumulate(batch, targets, settings, rows, scale, sums, old_entropy if ran <= fills else None)
            kl = torch.tensor([sums["approx_kl"] - kl_before, float(targets.mean_weights[mini].sum())], device=self.device)
            if target_kl is not None and past_target_kl(self._reduce(kl), target_kl):  # a collective only with a target
                opt.zero_grad()
                break
            self._stop_if(self.guard.count_step(clip_and_step(opt, self.trainer.strategy, self.optim_cfg.grad_clip)))
            steps += 1
        return {name: value * algo.mini_batches / ran for name, value in sums.items()}, steps

    def _accumulate(self, batch: RolloutBatch, targets: StepTargets, settings: ObjectiveSettings, rows: torch.Tensor,
                    scale: float, sums: dict[str, float], old_entropy: torch.Tensor | None) -> None:
        """Backward of the micro-batch ``rows``, adding its terms to ``sums`` (and its work to the clock's FLOPs); an
        empty one runs a zero-weight pass on row 0 (:func:`rows_or_first`). Given ``old_entropy`` (the rows' first
        forward, before any optimizer step where the loss reads them) it writes the rows' old log-probs and entropies. A non-finite loss makes every gradient of the pass NaN,
        so that the gradient-norm check skips the step on every rank (training/optim.py's ``clip_and_step``)."""
        weight, rows = (1.0 if len(rows) else 0.0), rows_or_first(rows)
        mb = batch.select(rows)
        sharing = self.clock.count_pass(self._sharing(mb), mb.input_ids, mb.response_mask)
        logprob, entropy = self._token_outputs(mb, sharing)
        if old_entropy is not None and weight:
            targets.old_logprobs[rows, : logprob.shape[1]] = logprob.detach()
            old_entropy[rows, : entropy.shape[1]] = entropy.detach()
        values = self.critic(mb.input_ids, mb.attention_mask, sharing) if self.critic is not None else None
        loss, terms = epo_objective(logprob, entropy, values, targets.select(rows, mb.input_ids.shape[1]), settings)
        poison = torch.where(torch.isfinite(loss.detach()), 1.0, float("nan"))  # 1, or NaN for a non-finite loss
        self.manual_backward(loss * (scale * weight) * poison)
        for name, value in terms.items():
            sums[name] = sums.get(name, 0.0) + weight * float(value)

    # ----------------------------------------------------------------- forward passes
    def _token_outputs(self, mb: RolloutBatch, sharing: Sharing, model: torch.nn.Module | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs and entropies ``[n, L]`` of ``mb``'s response tokens under ``model`` (the actor by default)."""
        return actor_token_outputs(model if model is not None else self.actor, mb.input_ids, mb.attention_mask,
                                   mb.response_mask, self.model_cfg.get("logits_chunk_size"),
                                   self.hparams.train_temperature, sharing)

    def _reference_logprobs(self, mb: RolloutBatch, sharing: Sharing) -> torch.Tensor:
        """``mb``'s response log-probs under the frozen reference, or with LoRA the adapter-free actor (the same base)."""
        with nullcontext() if self.reference is not None else self.actor.disable_adapter():
            return self._token_outputs(mb, sharing, self.reference)[0]

    def _micro_batches(self, batch: RolloutBatch, groups: list[torch.Tensor]) -> list[list[torch.Tensor]]:
        return plan_micro_batches(batch, groups, self.algo.micro_batch_size, self.algo.get("micro_batch_tokens"),
                                  self.model_cfg.get("fold_turns", False), self._reduce, self.algo.batch_by_episode)

    def _sharing(self, mb: RolloutBatch) -> Sharing:
        zero3 = self._trainer is not None and zero_stage(self.trainer.strategy) == 3
        return micro_batch_sharing(mb, self.model_cfg.get("fold_turns", False),
                                   self.model_cfg.get("shared_prefix", False), self._reduce if zero3 else None)

    def _reduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """``t`` reduced over all ranks (``sum``, ``max`` or ``min``); itself on a single process."""
        return self.trainer.strategy.reduce(t, reduce_op=op) if self.trainer.world_size > 1 else t

    def _param_norms(self) -> torch.Tensor:
        return param_norms((self.actor, self.critic), self._reduce if zero_stage(self.trainer.strategy) == 3 else None)

    def _stop_if(self, reason: str | None, cause: Exception | None = None) -> None:
        """Stop RL step k before it is checkpointed (training/divergence_guard.py), where there is a ``reason``."""
        if reason is not None:
            callback = self.trainer.checkpoint_callback
            raise diverged_error(self.rl_step, reason, callback.dirpath if callback is not None else None) from cause

    # ----------------------------------------------------------------- hooks around the step
    def on_train_start(self) -> None:
        use_configured_lrs(self.lr_schedulers(), {"actor": self.optim_cfg.actor_lr, "critic": self.optim_cfg.critic_lr})

    def on_train_epoch_start(self) -> None:
        if self.reference is not None:  # Lightning's module.train() must not wake the frozen reference
            self.reference.eval()

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """Reseed for RL step k on this rank before its rollout is collected (core/seeding.py); start its clock."""
        seed_rl_step(self.hparams.seed, self.rl_step, self.global_rank)
        self.clock = StepClock(self.device)

    # ----------------------------------------------------------------- logging
    def _log_all(self, metrics: dict[str, float]) -> None:
        """Log values already equal on every rank (all-rank sums come from one reduction per step)."""
        for name, value in metrics.items():
            self.log(name, float(value), on_step=True, on_epoch=False, batch_size=1, prog_bar=name in PROGRESS_BAR)

    def _log_step(self, batch: RolloutBatch, entropy: torch.Tensor, targets: StepTargets, terms: dict[str, float],
                  s: ObjectiveSettings, optimizer_steps: int) -> StepReport:
        """Log RL step k's metrics (training/step_log.py; one collective) and return its report for the callbacks."""
        edges = (self.hparams.edge_turns, self.hparams.edge_tokens)
        total = step_sums(batch, entropy, targets, terms, s, edges, self.hparams.max_turns).reduce(self._reduce)
        metrics = step_metrics(total, list(batch.stats), terms, s, self.trainer.world_size, self.algo.entropy_coef > 0)
        metrics |= {"train/lr": self.lr_schedulers().get_last_lr()[0], "train/skipped_steps": self.guard.skipped_steps}
        if self.algo.get("target_kl") is not None:  # without a target it is always ppo_epochs * mini_batches
            metrics["ppo/optimizer_steps"] = optimizer_steps
        self._log_all(metrics)
        return StepReport(rl_step=self.rl_step, entropy_mean=ratio(total["entropy"]) or 0.0,
                          turn_entropy=turn_means(total["turns"].view(2, -1)), rollout=batch)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Log RL step k's ``perf/*`` values (training/step_clock.py) and say them in one line: Lightning calls this
        after every callback's hook, so the weight push and the checkpoint are in."""
        batch = self.step_report.rollout
        flops = update_flops(self.actor, self.critic, self.clock.decoder_positions, float(self.clock.logit_positions))
        dtype = torch.bfloat16 if "bf16" in str(self.trainer.precision) else next(self.actor.parameters()).dtype
        peak = matmul_peak_flops(self.device.type, dtype)
        metrics = perf_metrics(self.clock, flops, peak, self._reduce, self.trainer.world_size)
        self._log_all(metrics)
        if self.global_rank == 0:
            log.info(step_line(self.rl_step - 1, {**batch.stats, **metrics}, peak))

    # ----------------------------------------------------------------- evaluation
    def on_validation_epoch_start(self) -> None:
        self.val_metrics.restart(self.device)

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """``batch``: finished evaluation episodes of one split (collected at val temperature)."""
        for name, metric in self.val_metrics.add(batch).items():
            self.log(name, metric, on_step=False, on_epoch=True, add_dataloader_idx=False)

    def on_validation_epoch_end(self) -> None:
        """Log the evaluation's collection time and, with loggers, its step (:meth:`EvalMetrics.closing`)."""
        self.log_dict(self.val_metrics.closing(self.rl_step, bool(self.loggers)), on_epoch=True, batch_size=1)

    # ----------------------------------------------------------------- checkpoint state
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["rl_state"] = {"rl_step": self.rl_step, **self.guard.state_dict()}
        if self.state_settings is not None:
            checkpoint["state_settings"] = self.state_settings

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Restore the RL step counters; reopen a finished run resumed to train more steps."""
        if self.trainer.state.fn == "fit":
            reopen_if_extended(checkpoint, self.hparams.total_steps)
        state = checkpoint.get("rl_state", {})
        self.rl_step = state.get("rl_step", 0)
        self.guard.load_state_dict(state)
