"""Task sampling: deterministic evaluation samples, whole GRPO groups, a sampler whose state is its step."""

from __future__ import annotations

from collections import Counter

from lightning_epo.envs.base import Task
from lightning_epo.rollout.datamodule import TaskSampler, validation_sample

TASKS = [Task("iid", name, v) for name in ("boil", "melt", "grow") for v in range(10)] + [Task("iid", "rare", 0)]


def test_validation_sample_is_deterministic_for_a_seed_and_round_robin_over_families():
    a = validation_sample(TASKS, 8, seed=3)
    assert a == validation_sample(list(TASKS), 8, seed=3)  # same episodes for every run and algorithm
    assert a != validation_sample(TASKS, 8, seed=4)
    # families in name order, one task each per round: boil grow melt rare | boil grow melt | boil
    assert Counter(t.name for t in a) == {"boil": 3, "grow": 2, "melt": 2, "rare": 1}
    assert validation_sample(TASKS, None, seed=0) == TASKS


def test_validation_sample_above_the_split_size_plays_every_task_again():
    """Episodes per split, not tasks: 65 over 31 tasks = every task twice plus 3 round-robin."""
    sample = validation_sample(TASKS, 65, seed=3)
    assert sample[:62] == TASKS * 2 and sample[62:] == validation_sample(TASKS, 3, seed=3)
    assert validation_sample(TASKS, 31, seed=3) == TASKS


def test_grpo_groups_share_one_task_and_variation():
    sampler = TaskSampler(TASKS, seed=0, groups_per_step=3, group_size=4)
    tasks, groups = sampler.draw(rank=0)
    assert len(tasks) == 12 and groups == [0] * 4 + [1] * 4 + [2] * 4
    for g in range(3):
        assert len({tasks[i] for i in range(12) if groups[i] == g}) == 1


def test_sampler_state_is_its_step_so_a_restored_sampler_draws_the_same_tasks():
    first = TaskSampler(TASKS, seed=1, groups_per_step=2, group_size=2)
    draws = [first.draw() for _ in range(3)]
    restored = TaskSampler(TASKS, seed=1, groups_per_step=2, group_size=2)
    restored.step = 2
    assert restored.draw() == draws[2]
    assert first.draw(rank=1) != TaskSampler(TASKS, seed=1, groups_per_step=2, group_size=2).draw(rank=0)
