"""Every evaluation episode's outcome with its task and its place in the validation sample, all ranks' in one file, and
read back as the run's final evaluation for pairing."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
import torch.multiprocessing as mp

from lightning_epo.callbacks import EvalEpisodesLog
from lightning_epo.callbacks.eval_episodes import gathered
from lightning_epo.core.errors import UserError
from lightning_epo.reports.eval_episodes import final_outcomes, pair_outcomes
from lightning_epo.rollout.datamodule import EvalBatch
from lightning_epo.rollout.episode import Episode


def batch(split, wins, tasks=None):
    tasks = tasks or [f"task {i}" for i in range(len(wins))]
    return EvalBatch(split, [Episode(traj_id=i, group_id=i, task=t, won=w, episode_return=10.0 * w,
                                     task_name=f"name {t}") for i, (t, w) in enumerate(zip(tasks, wins))])


def evaluate(log, rl_step, batches, rank=0, world=1, sanity=False):
    trainer = SimpleNamespace(sanity_checking=sanity, global_rank=rank, world_size=world, is_global_zero=rank == 0)
    module = SimpleNamespace(rl_step=rl_step)
    log.on_validation_epoch_start(trainer, module)
    for index, b in enumerate(batches):
        log.on_validation_batch_end(trainer, module, None, b, 0, index)
    log.on_validation_epoch_end(trainer, module)


def test_each_evaluation_appends_its_episodes_in_split_and_place_order(tmp_path):
    log = EvalEpisodesLog(str(tmp_path))
    evaluate(log, 0, [batch("ood", [False, True]), batch("iid", [True, False, True])])
    evaluate(log, 0, [batch("iid", [True] * 3)], sanity=True)  # Lightning's sanity check is not an evaluation
    evaluate(log, 10, [batch("iid", [False, False, True])])
    rows = [json.loads(line) for line in (tmp_path / "eval_episodes.jsonl").read_text().splitlines()]
    assert [(r["after_rl_steps"], r["split"], r["place"], r["won"]) for r in rows] == [
        (0, "iid", 0, True), (0, "iid", 1, False), (0, "iid", 2, True), (0, "ood", 0, False), (0, "ood", 1, True),
        (10, "iid", 0, False), (10, "iid", 1, False), (10, "iid", 2, True)]
    assert rows[0] == {"mode": "train", "after_rl_steps": 0, "split": "iid", "place": 0, "task": "task 0",
                       "task_name": "name task 0", "won": True, "return": 10.0, "turns": 0, "truncated": False}
    assert final_outcomes(tmp_path, "iid") == {0: ("task 0", False), 1: ("task 1", False), 2: ("task 2", True)}
    assert final_outcomes(tmp_path, "ood") == {0: ("task 0", False), 1: ("task 1", True)}
    assert final_outcomes(tmp_path, "heldout") is None and final_outcomes(tmp_path / "none", "iid") is None


def test_rank_r_of_w_plays_places_r_plus_w_times_its_episode_index(tmp_path):
    log = EvalEpisodesLog(str(tmp_path))
    trainer = SimpleNamespace(sanity_checking=False, global_rank=1, world_size=2, is_global_zero=False)
    log.on_validation_batch_end(trainer, SimpleNamespace(rl_step=5), None, batch("iid", [True, False, True]), 0)
    assert [row["place"] for row in log.rows] == [1, 3, 5]
    log.on_validation_epoch_end(trainer, SimpleNamespace(rl_step=5))
    assert not (tmp_path / "eval_episodes.jsonl").exists()  # rank 0 writes
    assert gathered([{"place": 1}], 2) == [{"place": 1}]  # no process group: a rank's own rows


def test_a_replayed_evaluation_keeps_its_last_lines_and_mode_eval_is_not_the_training_s(tmp_path):
    log = EvalEpisodesLog(str(tmp_path))
    evaluate(log, 10, [batch("iid", [False, False])])  # stopped in the middle of the evaluation: played again
    evaluate(log, 10, [batch("iid", [True, False])])
    evaluate(EvalEpisodesLog(str(tmp_path), mode="eval"), 10, [batch("iid", [True, True])])
    assert final_outcomes(tmp_path, "iid") == {0: ("task 0", True), 1: ("task 1", False)}


def test_runs_that_played_other_tasks_are_not_paired():
    arm = {0: ("a", True), 1: ("b", False)}
    assert pair_outcomes(arm, {0: ("a", False), 1: ("b", False)}, "x") == [(True, False), (False, False)]
    with pytest.raises(UserError, match=r"x: the two runs' final evaluations did not play the same tasks \(places \[1\]"):
        pair_outcomes(arm, {0: ("a", False), 1: ("c", False)}, "x")
    with pytest.raises(UserError, match=r"places \[2\] differ"):
        pair_outcomes(arm, {**arm, 2: ("c", True)}, "x")


def _gather_worker(rank: int, world: int, init: str, out: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        log = EvalEpisodesLog(out)
        evaluate(log, 3, [batch("iid", [rank == 0, True, False][: 3 - rank], [f"t{rank + 2 * i}" for i in range(3)])],
                 rank=rank, world=world)
    finally:
        torch.distributed.destroy_process_group()


def test_two_ranks_write_one_file_with_every_place(tmp_path):
    """A 2-process gloo group: rank 0 plays places 0, 2, 4, rank 1 places 1, 3; rank 0 writes all five in place
    order."""
    mp.spawn(_gather_worker, args=(2, f"file://{tmp_path / 'store'}", str(tmp_path)), nprocs=2, join=True)
    rows = [json.loads(line) for line in (tmp_path / "eval_episodes.jsonl").read_text().splitlines()]
    assert [(r["place"], r["task"], r["won"]) for r in rows] == [
        (0, "t0", True), (1, "t1", False), (2, "t2", True), (3, "t3", True), (4, "t4", False)]
