"""An evaluation's metrics per split (``val/<split>/<name>``, names in :mod:`lightning_epo.core.metric_names`):
torchmetrics means over its episodes (the per-turn rates weighted by each episode's turns) and the count of
episodes, each synchronised over ranks by Lightning when the evaluation logs it."""

from __future__ import annotations

import torch
import torchmetrics

from lightning_epo.core.metric_names import EVAL_EPISODES, VAL_METRICS
from lightning_epo.rollout.datamodule import EvalBatch


class EvalMetrics(torch.nn.ModuleDict):
    """``<split>_<name>`` for every split and :data:`VAL_METRICS` name, and ``<split>_episodes``; ``seconds``: the
    running evaluation's collection time on this rank, summed over its splits (``perf/eval_s``)."""

    def __init__(self, splits: list[str]) -> None:
        super().__init__({
            **{f"{split}_{name}": torchmetrics.MeanMetric() for split in splits for name in VAL_METRICS},
            **{f"{split}_episodes": torchmetrics.SumMetric() for split in splits},  # over batches and ranks
        })
        self.seconds = 0.0

    def add(self, batch: EvalBatch) -> dict[str, torchmetrics.Metric]:
        """Add ``batch``'s finished episodes; returns its split's metrics by their logged names."""
        split = batch.split
        self.seconds += batch.wall_s
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
        return {**{f"val/{split}/{name}": self[f"{split}_{name}"] for name in VAL_METRICS},
                EVAL_EPISODES.format(split=split): self[f"{split}_episodes"]}

    def closing(self, rl_step: int, logged: bool) -> dict[str, float]:
        """What the evaluation after ``rl_step`` RL steps logs at its end: ``perf/eval_s`` (every split's collection
        time on this rank: ranks play their shares at once) and, where loggers write it (``logged``), the ``step``
        it is logged at: the index of the RL step it follows (0 before the first), Lightning's own for an evaluation
        inside ``fit``, which an evaluation that a resumed run plays before ``fit`` (lightning_epo/runtime/run.py)
        must be given (Lightning's count restarts at 0 there)."""
        return {"perf/eval_s": self.seconds} | ({"step": float(max(rl_step - 1, 0))} if logged else {})

    def restart(self, device: torch.device) -> None:
        """Fresh states for the next evaluation, made in its grad mode (a ``trainer.validate`` before ``fit`` leaves
        inference-mode tensors that fit's validation could not update in place) on ``device`` (ZeRO-3 moves only the
        parameters there, and the metrics' all-rank sync needs their states beside them)."""
        self.to(device)
        for metric in self.values():
            metric.reset()
        self.seconds = 0.0
