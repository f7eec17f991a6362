"""The evaluation's score and per-task metrics (training/eval_metrics.py): known episodes in, their means out; a
task or a score without episodes is not logged (never NaN)."""

from __future__ import annotations

import pytest

from lightning_epo.rollout.datamodule import EvalBatch
from lightning_epo.rollout.episode import Episode
from lightning_epo.training.eval_metrics import EvalMetrics


def _episode(i: int, task: str, won: bool, score: float | None) -> Episode:
    return Episode(traj_id=i, group_id=i, task=f"text of {task}", task_name=task, won=won, score=score)


def test_score_counts_a_failed_task_as_zero_and_tasks_are_kept_apart():
    metrics = EvalMetrics(["iid", "ood"], tasks=["find-plant", "find-animal", "boil"], scored=True)
    metrics.add(EvalBatch("iid", [_episode(0, "find-plant", True, 100.0), _episode(1, "find-plant", False, -100.0),
                                  _episode(2, "find-animal", False, 25.0)]))
    metrics.add(EvalBatch("iid", [_episode(3, "find-animal", True, 100.0)]))
    metrics.add(EvalBatch("ood", [_episode(0, "find-plant", False, None)]))  # a failed reset: no score
    totals = metrics.totals(["iid", "ood"])
    assert totals == pytest.approx({
        "val/iid/score": (100 + 0 + 25 + 100) / 4,
        "val/iid/task/find-plant/success": 0.5, "val/iid/task/find-plant/score": 50.0,
        "val/iid/task/find-animal/success": 0.5, "val/iid/task/find-animal/score": 62.5,
        "val/ood/task/find-plant/success": 0.0,  # no score where the episode had none; boil: no episode, no metric
    })


def test_without_a_score_or_tasks_nothing_more_is_logged():
    metrics = EvalMetrics(["iid"])
    metrics.add(EvalBatch("iid", [_episode(0, "a", True, 100.0)]))
    assert metrics.totals(["iid"]) == {}
    assert not any("totals" in key for key in metrics)  # nor kept


def test_a_new_evaluation_starts_from_zero():
    metrics = EvalMetrics(["iid"], tasks=["a"], scored=True)
    metrics.add(EvalBatch("iid", [_episode(0, "a", True, 100.0)]))
    import torch

    metrics.restart(torch.device("cpu"))
    metrics.add(EvalBatch("iid", [_episode(0, "a", False, 0.0)]))
    assert metrics.totals(["iid"]) == {"val/iid/score": 0.0, "val/iid/task/a/success": 0.0, "val/iid/task/a/score": 0.0}


def test_the_share_of_prompt_tokens_the_prefix_cache_served_is_over_every_split():
    metrics = EvalMetrics(["iid", "ood"])
    metrics.add(EvalBatch("iid", [_episode(0, "a", True, None)], stats={"prompt_tokens": 300.0,
                                                                         "cached_prompt_tokens": 100.0}))
    metrics.add(EvalBatch("ood", [_episode(1, "a", False, None)], stats={"prompt_tokens": 100.0,
                                                                         "cached_prompt_tokens": 100.0}))
    assert metrics.closing(rl_step=0, logged=False)["perf/eval_prefix_cache_share"] == pytest.approx(0.5)
    uncached = EvalMetrics(["iid"])
    uncached.add(EvalBatch("iid", [_episode(0, "a", True, None)], stats={"prompt_tokens": 300.0}))
    assert "perf/eval_prefix_cache_share" not in uncached.closing(rl_step=0, logged=False)
