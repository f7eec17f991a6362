"""GridWorld: the expert wins, episodes are deterministic, splits are disjoint, invalid actions do nothing."""

from __future__ import annotations

import pickle
import random
import re
import time

import pytest

from lightning_epo.envs.base import Task
from lightning_epo.envs.gridworld import (
    ACTIONS,
    SAFETY_STEP_CAP,
    SPLITS,
    GridworldEnv,
    GridworldSuite,
    generate_layout,
)

SAMPLED_TASKS = 30


@pytest.fixture(scope="module")
def suite() -> GridworldSuite:
    return GridworldSuite(num_train_tasks=300, num_eval_tasks=60)


def sample(tasks: list[Task], n: int = SAMPLED_TASKS) -> list[Task]:
    return tasks[:: max(1, len(tasks) // n)][:n]


def play_expert(env: GridworldEnv, task: Task, limit: int = 100) -> tuple[list[str], float, dict]:
    """Follow ``info['expert_action']`` until done; returns the observations, the return and the last info."""
    observation, info = env.reset(task)
    observations, total = [observation], 0.0
    for _ in range(limit):
        action = info["expert_action"]
        assert action in info["admissible_actions"]
        observation, reward, done, info = env.step(action)
        assert info["action_valid"]
        observations.append(observation)
        total += reward
        if done:
            break
    return observations, total, info


@pytest.mark.parametrize("split", SPLITS)
def test_expert_wins_every_sampled_task_within_the_distance_bound(suite: GridworldSuite, split: str) -> None:
    env = suite.make_env()
    spec = suite.specs[split]
    for task in sample(suite.tasks(split)):
        observations, total, info = play_expert(env, task)
        turns = len(observations) - 1
        assert info["won"] and total == suite.success_reward, task
        assert spec.min_distance + 1 <= turns <= spec.max_distance + 1, task
        assert info["admissible_actions"] == [] and info["expert_action"] is None


def test_ood_needs_longer_expert_paths_on_larger_grids(suite: GridworldSuite) -> None:
    env = suite.make_env()
    mean_turns = {}
    for split in ("iid", "ood"):
        mean_turns[split] = sum(len(play_expert(env, t)[0]) - 1 for t in sample(suite.tasks(split))) / SAMPLED_TASKS
    assert mean_turns["ood"] > mean_turns["iid"] + 2
    assert suite.specs["ood"].size > suite.specs["iid"].size == suite.specs["train"].size


def test_same_task_gives_the_same_episode_in_any_process_copy(suite: GridworldSuite) -> None:
    copy = pickle.loads(pickle.dumps(suite))
    for task in sample(suite.tasks("train"), 10) + sample(suite.tasks("ood"), 10):
        assert play_expert(suite.make_env(), task)[0] == play_expert(copy.make_env(), task)[0]
    first_observations = {suite.make_env().reset(t)[0] for t in sample(suite.tasks("train"))}
    assert len(first_observations) > SAMPLED_TASKS // 2, "different tasks should mostly look different"


def test_splits_are_fixed_non_empty_and_disjoint(suite: GridworldSuite) -> None:
    tasks = {split: suite.tasks(split) for split in SPLITS}
    assert [len(tasks[s]) for s in SPLITS] == [300, 60, 60]
    assert GridworldSuite(num_train_tasks=300, num_eval_tasks=60).tasks("iid") == tasks["iid"]
    assert {t.name for t in tasks["train"]} == {"pick_up_key", "open_door"}
    variations = [{t.variation for t in tasks[s]} for s in SPLITS]
    assert sum(len(v) for v in variations) == len(set().union(*variations))
    assert all(t.split == s for s in SPLITS for t in tasks[s])


def test_more_evaluation_tasks_keep_the_first_ones(suite: GridworldSuite) -> None:
    # docs/learning.md evaluates on 1,000 tasks per split, whose first 100 are the tasks the runs evaluate on
    larger = GridworldSuite(num_train_tasks=300, num_eval_tasks=150)
    for split in ("iid", "ood"):
        assert larger.tasks(split)[:60] == suite.tasks(split)
        assert len(set(larger.tasks(split))) == 150


def test_iid_skips_layouts_that_a_train_task_already_has() -> None:
    # A 3x3 empty grid with distance 1 has only 24 layouts per family, so collisions are certain.
    small = GridworldSuite(
        size=3, wall_density=0.0, min_distance=1, max_distance=1, num_train_tasks=30, num_eval_tasks=5
    )
    train = {(t.name, generate_layout(small.specs["train"], t.name, t.variation)) for t in small.tasks("train")}
    iid = small.tasks("iid")
    assert len(iid) == 5
    assert not train & {(t.name, generate_layout(small.specs["iid"], t.name, t.variation)) for t in iid}
    assert iid[-1].variation - iid[0].variation > 4, "some colliding iid variations should have been skipped"


def test_invalid_actions_change_nothing(suite: GridworldSuite) -> None:
    env = suite.make_env()
    for task in sample(suite.tasks("train"), 10):
        observation, info = env.reset(task)
        blocked = [a for a in ACTIONS if a not in info["admissible_actions"]]
        for action in blocked + ["go up", "", "<action>go north</action>"]:
            new_observation, reward, done, new_info = env.step(action)
            assert new_observation == "Nothing happens. " + observation
            assert (reward, done, new_info["action_valid"], new_info["won"]) == (0.0, False, False, False)
            assert new_info["admissible_actions"] == info["admissible_actions"]
            assert new_info["expert_action"] == info["expert_action"]


def test_actions_are_matched_case_and_space_insensitively(suite: GridworldSuite) -> None:
    env = suite.make_env()
    _, info = env.reset(suite.tasks("train")[0])
    shouted = "  " + info["expert_action"].upper().replace(" ", "   ") + " "
    assert env.step(shouted)[3]["action_valid"]


def test_observation_tells_where_the_goal_is_and_which_sides_are_walls(suite: GridworldSuite) -> None:
    env = suite.make_env()
    for task in sample(suite.tasks("train")):
        observation, info = env.reset(task)
        layout = generate_layout(suite.specs["train"], task.name, task.variation)
        offset = {"north": 0, "south": 0, "east": 0, "west": 0}
        for count, direction in re.findall(r"(\d+) steps? (north|south|east|west)", observation.split(".")[0]):
            offset[direction] = int(count)
        assert offset["south"] - offset["north"] == layout.goal[0] - layout.start[0], observation
        assert offset["east"] - offset["west"] == layout.goal[1] - layout.start[1], observation
        walls = re.search(r"Walls? to the ([a-z, ]+)\.", observation)
        described = set(re.findall(r"north|south|east|west", walls.group(1))) if walls else set()
        open_sides = {a.removeprefix("go ") for a in info["admissible_actions"]}
        assert described == {"north", "south", "east", "west"} - open_sides, observation


def test_won_only_on_real_success() -> None:
    env = GridworldSuite(num_train_tasks=4).make_env()
    rng = random.Random(0)
    for task in GridworldSuite(num_train_tasks=4).tasks("train"):
        _, info = env.reset(task)
        goal_action = {"pick_up_key": "pick up key", "open_door": "open door"}[task.name]
        for _ in range(200):
            moves = [a for a in info["admissible_actions"] if a != goal_action]
            _, reward, done, info = env.step(rng.choice(moves))
            assert not (info["won"] or done or reward), task
    _, info = env.reset(Task("train", "pick_up_key", 0))
    for turn in range(SAFETY_STEP_CAP):
        _, reward, done, info = env.step("wait")
        assert not info["won"] and reward == 0.0
        assert done == (turn == SAFETY_STEP_CAP - 1)
    with pytest.raises(RuntimeError, match="reset"):
        env.step("go north")


def test_success_reward_is_configurable() -> None:
    small = GridworldSuite(success_reward=1.5, num_train_tasks=3)
    _, total, info = play_expert(small.make_env(), small.tasks("train")[2])
    assert info["won"] and total == 1.5


def test_bad_splits_and_settings_name_the_fix(suite: GridworldSuite) -> None:
    with pytest.raises(ValueError, match="valid splits: train, iid, ood"):
        suite.tasks("heldout")
    with pytest.raises(ValueError, match="env.suite.num_eval_tasks"):
        GridworldSuite(num_eval_tasks=0).tasks("ood")
    with pytest.raises(ValueError, match="env.suite.num_train_tasks"):
        GridworldSuite(num_train_tasks=0).tasks("train")
    with pytest.raises(ValueError, match="env.suite.ood_min_distance"):
        GridworldSuite(ood_size=4, ood_max_distance=7)
    with pytest.raises(ValueError, match="env.suite.size"):
        GridworldSuite(size=1)
    with pytest.raises(ValueError, match="env.suite.wall_density"):
        GridworldSuite(wall_density=0.9)
    with pytest.raises(ValueError, match="env.suite.goals"):
        GridworldSuite(goals=["find_treasure"])
    with pytest.raises(ValueError, match="task family"):
        suite.make_env().reset(Task("train", "find_treasure", 0))
    with pytest.raises(RuntimeError, match="before reset"):
        suite.make_env().step("go north")


def test_a_step_takes_microseconds(suite: GridworldSuite) -> None:
    env = suite.make_env()
    tasks = suite.tasks("ood")[:20]
    began = time.perf_counter()
    for task in tasks:
        _, info = env.reset(task)
        for _ in range(100):
            _, _, _, info = env.step(info["admissible_actions"][0])
    assert (time.perf_counter() - began) / (100 * len(tasks)) < 500e-6
