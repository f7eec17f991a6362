"""Every evaluation episode's outcome with its task: what a paired comparison pairs across the arms of a seed
(lightning_epo/reports/comparison, lightning_epo/reports/paired.py). A report, as ``eval.json`` and ``samples.jsonl``
are: nothing reads it back into a run (a run's state is its checkpoint's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch

from lightning_epo.callbacks.report_io import append_jsonl
from lightning_epo.core import layout
from lightning_epo.rollout.episode import Episode


def episode_outcome(ep: Episode, split: str, place: int) -> dict[str, Any]:
    """One evaluation episode as a JSON object: its split, its place in the split's validation sample, its task (the
    environment's text and the suite's name, ``""`` where the suite names none) and what came of it."""
    return {"split": split, "place": place, "task": ep.task, "task_name": ep.task_name, "won": bool(ep.won),
            "return": float(ep.episode_return), "turns": ep.num_turns, "truncated": bool(ep.truncated)}


def gathered(rows: list[dict[str, Any]], world: int) -> list[dict[str, Any]]:
    """Every rank's ``rows`` (rank order) on every rank; ``rows`` as they are in one process."""
    if world == 1 or not torch.distributed.is_initialized():
        return rows
    parts: list[list[dict[str, Any]]] = [[] for _ in range(world)]
    torch.distributed.all_gather_object(parts, rows)
    return [row for part in parts for row in part]


class EvalEpisodesLog(L.Callback):
    """After every evaluation (not Lightning's sanity check), appends one line per episode, every rank's, to
    ``RUN_DIR/eval_episodes.jsonl``, sorted by split and place::

        {"mode": "train", "after_rl_steps": 10, "split": "iid", "place": 0, "task": "...", "task_name": "...",
         "won": true, "return": 10.0, "turns": 7, "truncated": false}

    ``after_rl_steps``: the RL steps trained before the evaluation (0: ``val_at_start``'s); ``mode``: the run's
    (``train``, or ``eval`` for ``mode=eval``'s evaluation, which ``eval.json`` reports). ``place``: the episode's index
    in the split's validation sample (``validation_sample``: the same tasks, in the same order, for every run of a
    seed), so that two runs of a seed pair their episodes per task. Rank r of W plays places r, r + W, ... as its
    episodes ``traj_id = 0, 1, ...`` (``RolloutDataModule.eval_batch``), so the place is ``r + W · traj_id``. An
    evaluation played again (a resumed run's, after a stop in its middle) appends its lines again: readers keep the
    last line of a place."""

    def __init__(self, run_dir: str, mode: str = "train") -> None:
        self.path = Path(run_dir) / layout.EVAL_EPISODES
        self.mode = mode
        self.rows: list[dict[str, Any]] = []

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.rows = []

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        if trainer.sanity_checking:
            return
        rank, world = trainer.global_rank, trainer.world_size
        self.rows += [episode_outcome(ep, batch.split, rank + world * ep.traj_id) for ep in batch.episodes]

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        rows = gathered(self.rows, trainer.world_size)  # a collective: every rank calls it
        if trainer.is_global_zero:
            head = {"mode": self.mode, "after_rl_steps": pl_module.rl_step}
            append_jsonl(self.path, [head | row for row in sorted(rows, key=lambda r: (r["split"], r["place"]))])
        self.rows = []
