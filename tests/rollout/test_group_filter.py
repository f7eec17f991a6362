"""Dynamic sampling: the kept groups are the mixed-outcome ones first, whole, in draw order; the share of mixed
groups is logged for any grouped step, oversampled or not."""

from __future__ import annotations

import random
from functools import partial

import pytest

from lightning_epo.envs.gridworld import GridworldSuite
from lightning_epo.envs.sync_pool import SyncEnvPool
from lightning_epo.rollout.collector import EpisodeCollector
from lightning_epo.rollout.datamodule import RolloutDataModule
from lightning_epo.rollout.episode import Episode
from lightning_epo.rollout.expert_engine import ExpertEngine
from lightning_epo.rollout.group_filter import is_mixed, keep_mixed_groups, mixed_share
from lightning_epo.rollout.prompts import PromptBuilder

MOVES = ["go north", "go south", "go east", "go west"]


def _episodes(outcomes: dict[int, list[bool]]) -> list[Episode]:
    eps, traj = [], 0
    for group, wins in outcomes.items():
        for won in wins:
            eps.append(Episode(traj_id=traj, group_id=group, task=f"t{group}", won=won))
            traj += 1
    return eps


def test_mixed_groups_come_first_then_the_others_each_in_draw_order():
    eps = _episodes({0: [True, True], 1: [True, False], 2: [False, False], 3: [False, True]})
    assert mixed_share(eps) == 0.5
    assert [ep.group_id for ep in keep_mixed_groups(eps, 3)] == [1, 1, 3, 3, 0, 0]  # whole groups, mixed ones first
    assert keep_mixed_groups(eps, 2) == [e for e in eps if e.group_id in (1, 3)]
    assert keep_mixed_groups(eps, 9) == [e for g in (1, 3, 0, 2) for e in eps if e.group_id == g]


def _datamodule(tokenizer, oversample: int, group_size: int = 4) -> RolloutDataModule:
    """A gridworld DataModule wired by hand around a very noisy expert (70 % random moves, 6 turns), so that
    a group of 4 rollouts often mixes wins and losses."""
    suite = GridworldSuite(num_train_tasks=40)
    dm = RolloutDataModule(
        suite=suite, pool=partial(SyncEnvPool, size=64), engine=None, model=None,
        collector=partial(EpisodeCollector, prompt=PromptBuilder("gridworld", history_length=2, think=False), max_turns=6),
        episodes_per_step=16, group_size=group_size, val_size=None, eval_splits=["iid"], train_sampling={}, val_sampling={},
        oversample=oversample,
    )
    dm.tokenizer = tokenizer
    dm.engine = ExpertEngine(tokenizer, explore_prob=0.7, explore_actions=MOVES)
    dm.pool = dm.make_pool(suite=suite)
    dm.collector = dm._collector(dm.engine)
    dm.sampler.tasks = suite.tasks("train")
    return dm


def test_oversampled_step_trains_on_the_step_size_with_mixed_groups_first(tokenizer):
    random.seed(0)
    plain = _datamodule(tokenizer, oversample=1).next_train_batch()
    random.seed(0)
    filtered = _datamodule(tokenizer, oversample=4).next_train_batch()

    outcomes: dict[int, set[bool]] = {}
    for ep in plain.episodes:
        outcomes.setdefault(ep.group_id, set()).add(ep.won)
    counted = sum(len(won) > 1 for won in outcomes.values()) / len(outcomes)  # counted here, not by group_filter
    assert plain.stats["train/mixed_groups"] == pytest.approx(counted)  # logged without oversampling too
    collected_share = filtered.stats["train/mixed_groups"]  # over the 16 collected groups
    assert 0.25 <= collected_share < 1.0  # enough mixed groups to fill the batch, and some to drop
    for batch in (plain, filtered):
        assert len(batch.episodes) == 16 and len({ep.group_id for ep in batch.episodes}) == 4
    kept = [[ep for ep in filtered.episodes if ep.group_id == g] for g in {ep.group_id for ep in filtered.episodes}]
    assert all(len(group) == 4 and is_mixed(group) for group in kept)


def test_a_step_without_groups_logs_no_mixed_share(tokenizer):
    """Groups of one (PPO) are never mixed: a share of 0 would read as GRPO without a signal, so none is logged."""
    random.seed(0)
    assert "train/mixed_groups" not in _datamodule(tokenizer, oversample=1, group_size=1).next_train_batch().stats
