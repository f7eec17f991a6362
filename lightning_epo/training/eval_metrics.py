"""An evaluation's metrics per split (``val/<split>/<name>``, names in :mod:`lightning_epo.core.metric_names`):
torchmetrics means over its episodes (the per-turn rates weighted by each episode's turns) and the count of
episodes, each synchronised over ranks by Lightning when the evaluation logs it. Where the environment scores its
episodes (``scored``) the mean score, and for the named ``tasks`` each one's success and score: sums over ranks read
at the evaluation's end (:meth:`EvalMetrics.totals`), logged only where there were episodes."""

from __future__ import annotations

import warnings

import torch
import torchmetrics

from lightning_epo.core.metric_names import EVAL_EPISODES, TASK_METRICS, VAL_METRICS, VAL_SCORE, VAL_TASK
from lightning_epo.rollout.datamodule import EvalBatch
from lightning_epo.rollout.progress_log import prefix_cache_share

PROMPT_COUNTS = ("prompt_tokens", "cached_prompt_tokens")  # a collection's counters the cache share is made of


class Totals(torchmetrics.Metric):
    """Elementwise sums of fixed-length vectors over batches and ranks: ``[episodes, wins, scored episodes, score
    sum]``."""

    full_state_update = False

    def __init__(self, size: int = 4) -> None:
        super().__init__()
        self.add_state("sums", default=torch.zeros(size, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, values: torch.Tensor) -> None:
        self.sums += values.to(self.sums)

    def compute(self) -> torch.Tensor:
        return self.sums


class EvalMetrics(torch.nn.ModuleDict):
    """``<split>_<name>`` for every split and :data:`VAL_METRICS` name, and ``<split>_episodes``; ``seconds``: the
    running evaluation's collection time on this rank, summed over its splits (``perf/eval_s``); ``prompts``: its
    prompt tokens and those the engine's prefix cache served, on this rank (``perf/eval_prefix_cache_share``).

    ``scored``: the episodes carry the environment's score (``Episode.score``), ``val/<split>/score`` is its mean, a
    negative score (ScienceWorld's failed task, -100) counted as 0. ``tasks``: task names (``Episode.task_name``) whose
    success and score are kept apart, ``val/<split>/task/<name>/success`` and ``.../score``."""

    def __init__(self, splits: list[str], tasks: list[str] | None = None, scored: bool = False) -> None:
        self.splits, self.tasks = list(splits), list(tasks or [])
        self.scored = scored
        groups = ["", *(f"task:{task}" for task in self.tasks)]  # the split as a whole (score), then each task
        super().__init__({
            **{f"{split}_{name}": torchmetrics.MeanMetric() for split in splits for name in VAL_METRICS},
            **{f"{split}_episodes": torchmetrics.SumMetric() for split in splits},  # over batches and ranks
            # [episodes, wins, scored episodes, score sum] per split and group, summed over batches and ranks
            **{_totals_key(split, group): Totals() for split in splits for group in groups if group or scored},
        })
        self.seconds, self.prompts = 0.0, {}

    def add(self, batch: EvalBatch) -> dict[str, torchmetrics.Metric]:
        """Add ``batch``'s finished episodes; returns its split's metrics by their logged names."""
        split = batch.split
        self.seconds += batch.wall_s
        for name in PROMPT_COUNTS:
            if name in batch.stats:
                self.prompts[name] = self.prompts.get(name, 0.0) + batch.stats[name]
        self[f"{split}_episodes"].update(float(len(batch.episodes)))
        for ep in batch.episodes:
            self[f"{split}_success"].update(float(ep.won))
            self[f"{split}_reward"].update(ep.episode_return)
            self[f"{split}_turns"].update(ep.num_turns)
            if ep.num_turns:  # per-turn means: each episode weighted by its turns
                tokens = sum(len(turn.response_ids) for turn in ep.turns)
                self[f"{split}_invalid_action_rate"].update(ep.invalid_actions / ep.num_turns, ep.num_turns)
                self[f"{split}_format_error_rate"].update(ep.format_errors / ep.num_turns, ep.num_turns)
                self[f"{split}_response_tokens"].update(tokens / ep.num_turns, ep.num_turns)
            score = max(ep.score, 0.0) if self.scored and ep.score is not None else None
            counts = torch.tensor([1.0, float(ep.won), float(score is not None), score or 0.0])
            for group in ("", f"task:{ep.task_name}"):
                if _totals_key(split, group) in self:
                    self[_totals_key(split, group)].update(counts)
        return {**{f"val/{split}/{name}": self[f"{split}_{name}"] for name in VAL_METRICS},
                EVAL_EPISODES.format(split=split): self[f"{split}_episodes"]}

    def totals(self, splits: list[str]) -> dict[str, float]:
        """The score and the per-task metrics of ``splits``, over every rank (a collective: every rank calls it, in
        the same order), each only where it had episodes: ``{"val/iid/score": 41.5, "val/iid/task/find-plant/success":
        0.25, ...}``."""
        metrics = {}
        for split in splits:
            for group in ["", *(f"task:{task}" for task in self.tasks)]:
                key = _totals_key(split, group)
                if key not in self:
                    continue
                with warnings.catch_warnings():  # a rank without episodes of the task computes zeros, as it should
                    warnings.filterwarnings("ignore", message=".*was called before the ``update`` method")
                    episodes, wins, scored, score = self[key].compute().tolist()
                if group and episodes:
                    task = group.removeprefix("task:")
                    metrics[VAL_TASK.format(split=split, task=task, name=TASK_METRICS[0])] = wins / episodes
                    if scored:
                        metrics[VAL_TASK.format(split=split, task=task, name=TASK_METRICS[1])] = score / scored
                elif not group and scored:
                    metrics[VAL_SCORE.format(split=split)] = score / scored
        return metrics

    def closing(self, rl_step: int, logged: bool) -> dict[str, float]:
        """What the evaluation after ``rl_step`` RL steps logs at its end: ``perf/eval_s`` (every split's collection
        time on this rank: ranks play their shares at once), ``perf/eval_prefix_cache_share`` (this rank's, with an
        engine that has a prefix cache) and, where loggers write it (``logged``), the ``step``
        it is logged at: the index of the RL step it follows (0 before the first), Lightning's own for an evaluation
        inside ``fit``, which an evaluation that a resumed run plays before ``fit`` (lightning_epo/runtime/run.py)
        must be given (Lightning's count restarts at 0 there); and the score and per-task metrics (:meth:`totals`,
        summed over ranks here: a collective). So ``val_at_start`` with ``test_every=1`` logs two evaluations at step
        0 (before and after the first RL step): a metric history keeps the later, ``eval_episodes.jsonl`` both (by
        ``after_rl_steps``)."""
        step = {"step": float(max(rl_step - 1, 0))} if logged else {}
        cache = prefix_cache_share(self.prompts, "perf/eval_prefix_cache_share")
        return {"perf/eval_s": self.seconds} | cache | self.totals(self.splits) | step

    def restart(self, device: torch.device) -> None:
        """Fresh states for the next evaluation, made in its grad mode (a ``trainer.validate`` before ``fit`` leaves
        inference-mode tensors that fit's validation could not update in place) on ``device`` (ZeRO-3 moves only the
        parameters there, and the metrics' all-rank sync needs their states beside them)."""
        self.to(device)
        for metric in self.values():
            metric.reset()
        self.seconds, self.prompts = 0.0, {}


def _totals_key(split: str, group: str) -> str:
    """The module key of a split's sums: the whole split (``group`` ""), or one task (``task:<name>``); ModuleDict
    keys take no dots, so a task's own dots are written as ``·``."""
    return f"{split}_totals" + (f"_{group}".replace(".", "\u00b7") if group else "")
