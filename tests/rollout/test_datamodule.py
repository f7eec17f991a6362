"""Task sampling: deterministic evaluation samples, whole GRPO groups, a sampler whose state is its step."""

from __future__ import annotations

from collections import Counter

import hydra
import pytest
import torch

from lightning_epo.envs.base import Task
from lightning_epo.rollout.datamodule import TaskSampler, validation_sample
from lightning_epo.rollout.engine import Generation

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


def test_shuffled_order_plays_every_task_once_per_pass_and_restores_from_its_step():
    """31 tasks, 3 groups a step: steps 0-9 play 30 different tasks, step 10 ends the pass and starts the next."""
    sampler = TaskSampler(TASKS, seed=5, groups_per_step=3, group_size=2, order="shuffled")
    draws = [sampler.draw()[0][::2] for _ in range(12)]  # one task per group
    first_pass = [t for d in draws for t in d][:31]
    assert sorted(first_pass, key=repr) == sorted(TASKS, key=repr)
    assert [t for d in draws for t in d][31:] != first_pass[:5]  # the next pass is a new permutation
    restored = TaskSampler(TASKS, seed=5, groups_per_step=3, group_size=2, order="shuffled")
    restored.step = 10
    assert restored.draw()[0][::2] == draws[10]
    other_seed = TaskSampler(TASKS, seed=6, groups_per_step=3, group_size=2, order="shuffled")
    assert [other_seed.draw()[0][::2] for _ in range(3)] != draws[:3]


def test_shuffled_order_gives_ranks_disjoint_places_of_the_one_stream():
    """Two ranks together play what one rank plays in twice the steps: no task twice within a pass."""
    one = TaskSampler(TASKS, seed=2, groups_per_step=3, group_size=1, order="shuffled")
    alone = [t for _ in range(4) for t in one.draw()[0]]
    ranks = [TaskSampler(TASKS, seed=2, groups_per_step=3, group_size=1, order="shuffled") for _ in range(2)]
    together = [t for _ in range(2) for r, sampler in enumerate(ranks) for t in sampler.draw(rank=r, world=2)[0]]
    assert together == alone and len(set(together)) == len(together)


def test_random_order_draws_with_replacement():
    """The default: in 11 steps of 3 groups from 31 tasks, some task comes twice within the first 31 draws."""
    sampler = TaskSampler(TASKS, seed=5, groups_per_step=3, group_size=1)
    drawn = [t for _ in range(11) for t in sampler.draw()[0]][:31]
    assert len(set(drawn)) < 31


def test_task_order_reaches_the_sampler_from_the_command_line(compose_cfg):
    datamodule = hydra.utils.instantiate(compose_cfg("env=gridworld", "data.task_order=shuffled").data)
    assert datamodule.sampler.order == "shuffled"
    assert hydra.utils.instantiate(compose_cfg("env=gridworld").data).sampler.order == "random"


def test_an_unknown_task_order_is_refused_not_drawn_at_random():
    """The start check names the choices for the command line; a sampler built in code refuses too."""
    with pytest.raises(ValueError, match="order='shufled' is not one of: random, shuffled"):
        TaskSampler(TASKS, seed=0, groups_per_step=1, group_size=1, order="shufled")


class RecordingEngine:
    """Records the engine calls; answers every prompt with its stop token (an invalid action)."""

    def __init__(self, tokenizer):
        self.calls, self.stop = [], tokenizer.eos_token_id

    def generate(self, prompts, sampling, infos=None):
        self.calls.append("generate")
        return [Generation([self.stop], [0.0], "stop") for _ in prompts]

    def sync_weights(self, actor):
        self.calls.append("sync_weights")

    def before_collection(self):
        self.calls.append("before_collection")

    def release_memory(self):
        self.calls.append("release_memory")

    def close(self):
        self.calls.append("close")


def test_an_evaluation_engine_of_its_own_sleeps_and_gets_weights_only_to_evaluate(compose_cfg):
    """A supervised stage trains on its expert's episodes: its evaluation engine (vLLM, as a warm start's on a vLLM
    run) gives its memory back from its start and gets the actor's weights before an evaluation, once, not after
    every update (a vLLM engine would copy them and, on a GPU, wake and hold its memory through training)."""
    cfg = compose_cfg("experiment=gridworld_sft", "env.val_size=1", "env.max_turns=2")
    datamodule = hydra.utils.instantiate(cfg.data, engine=RecordingEngine, val_engine=RecordingEngine)
    datamodule.setup("fit")
    trains, evaluates = datamodule.engine, datamodule.val_engine
    assert evaluates.calls == ["release_memory"] and trains.calls == []
    actor = torch.nn.Linear(1, 1)
    datamodule.sync_weights(actor), datamodule.sync_weights(actor)  # after two updates
    assert trains.calls == ["sync_weights"] * 2 and evaluates.calls == ["release_memory"]
    datamodule.eval_batch("iid"), datamodule.eval_batch("ood")
    assert evaluates.calls[:4] == ["release_memory", "sync_weights", "before_collection", "generate"]
    assert evaluates.calls.count("sync_weights") == 1 and evaluates.calls.count("before_collection") == 2
    datamodule.teardown("fit")


def test_one_engine_for_training_and_evaluation_gets_every_update(compose_cfg):
    datamodule = hydra.utils.instantiate(compose_cfg("env=gridworld").data, engine=RecordingEngine)
    datamodule.setup("fit")
    datamodule.sync_weights(torch.nn.Linear(1, 1))
    assert datamodule.engine.calls == ["sync_weights"]  # no sleep at start: it generates first
    datamodule.teardown("fit")
