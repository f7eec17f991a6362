"""ScienceWorld wrapper: splits, rewards, validity, expert path and JVM lifecycle.

Tests that start a JVM are marked ``sciworld``; the gold-path sweep over all tasks is also ``slow``.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import shutil
import subprocess

import pytest

if importlib.util.find_spec("scienceworld") is None:
    pytest.skip("scienceworld is not installed (pip install scienceworld==1.2.3)", allow_module_level=True)
if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip("ScienceWorld needs Java (apt-get install openjdk-17-jre-headless)", allow_module_level=True)

from lightning_epo.core.errors import ConfigError, UserError  # noqa: E402
from lightning_epo.envs import sciworld  # noqa: E402
from lightning_epo.envs.base import Task  # noqa: E402
from lightning_epo.envs.sciworld import HELDOUT_TASKS, SciWorldEnv, SciWorldSuite, Simulator  # noqa: E402
from lightning_epo.envs.testing import follow_expert  # noqa: E402
from lightning_epo.runtime.config import validate  # noqa: E402

HELDOUT_INDICES = (1, 4, 8, 11, 13, 16, 18, 21, 24, 28)


def _alive(pid: int) -> bool:
    return subprocess.run(["ps", "-p", str(pid)], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def suite() -> SciWorldSuite:
    return SciWorldSuite()


@pytest.fixture(scope="module")
def env():
    env = SciWorldEnv(gold_path=True, jvm_heap_mb=512)
    yield env
    env.close()


@pytest.fixture(scope="module")
def simulator(env) -> Simulator:
    """The JVM of the shared ``env`` (every episode test resets it first)."""
    return env._sim


def _play_gold(env: SciWorldEnv, task: Task, limit: int = 250) -> list[tuple[float, bool, dict]]:
    return follow_expert(env, env.reset(task)[1], limit)


# --- configuration errors (no JVM) ---------------------------------------------------------------


def test_bad_arguments_fail_with_the_fix(compose_cfg):
    with pytest.raises(ConfigError, match="split_level"):
        SciWorldSuite(split_level="hard")
    with pytest.raises(ConfigError, match="teleportAction"):
        SciWorldSuite(simplification="easy,teleport")
    with pytest.raises(ConfigError, match="env.suite.jvm_heap_mb must be an integer >= 256, got 64"):
        validate(compose_cfg("env=sciworld", "env.suite.jvm_heap_mb=64"))
    with pytest.raises(ConfigError, match="env.suite.score_reward must be"):
        validate(compose_cfg("env=sciworld", "env.suite.score_reward=-1"))


def test_a_task_subset_is_refused_before_the_run_begins_naming_the_valid_tasks(compose_cfg, monkeypatch):
    """``env.suite.task_subset`` (the suite's ``tasks`` is its method): a name that is no task is one line at start,
    before the run seeds itself, listing the 29; the suite made directly refuses it too."""
    import lightning as L

    from lightning_epo.runtime.run import run

    monkeypatch.setattr(L, "seed_everything", lambda *a, **k: pytest.fail("the run began: refused too late"))
    with pytest.raises(ConfigError, match=r"^env.suite.task_subset names unknown find-plants: give a list of names "
                                          r"from: boil, .*, find-plant, .*test-conductivity-of-unknown-substances"):
        run(compose_cfg("env=sciworld", "debug=fast", "env.suite.task_subset=[find-plant,find-plants]"))
    with pytest.raises(ConfigError, match="env.suite.task_subset must be a list, got 'find-plant'"):
        validate(compose_cfg("env=sciworld", "env.suite.task_subset=find-plant"))
    validate(compose_cfg("env=sciworld", "env.suite.task_subset=[find-plant,boil]"))
    with pytest.raises(ConfigError, match="names no ScienceWorld task: x; give task names from: boil, "):
        SciWorldSuite(task_subset=["x"])
    with pytest.raises(ConfigError, match=r"must be a list of task names.*env.suite.task_subset=\[find-plant\]"):
        SciWorldSuite(task_subset="find-plant")
    with pytest.raises(ConfigError, match="holds only held-out tasks"):
        SciWorldSuite(split_level="heldout", task_subset=["find-plant"])
    with pytest.raises(ConfigError, match="holds none of the held-out tasks"):
        SciWorldSuite(split_level="heldout", task_subset=["boil"])


def test_a_task_subset_keeps_its_tasks_in_every_split():
    suite = SciWorldSuite(task_subset=["find-plant", "boil"])
    for split in ("train", "iid", "ood"):
        assert suite.task_names(split) == ["boil", "find-plant"]  # the simulator's order
        assert {task.name for task in suite.tasks(split)} == {"boil", "find-plant"}
    heldout = SciWorldSuite(split_level="heldout", task_subset=["find-plant", "boil"])
    assert heldout.task_names("train") == ["boil"] and heldout.task_names("heldout") == ["find-plant"]


def test_missing_java_names_the_fix_before_any_worker_starts(monkeypatch):
    monkeypatch.setattr(sciworld.shutil, "which", lambda name: None)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(UserError, match="needs Java.*openjdk"):
        SciWorldSuite()  # built in the parent when the run starts
    with pytest.raises(UserError, match="needs Java.*openjdk"):
        SciWorldEnv()


def test_unknown_or_unavailable_split_names_the_fix(suite):
    with pytest.raises(ConfigError, match="train, iid, ood, heldout"):
        suite.tasks("test")
    with pytest.raises(ConfigError, match="split_level=heldout"):
        suite.tasks("heldout")


# --- splits ------------------------------------------------------------------------------------


@pytest.mark.sciworld
def test_29_tasks_without_use_thermometer_in_simulator_order(suite, simulator):
    names = suite.task_names("train")
    simulator_names = [n for n in simulator.env.get_task_names() if n != "use-thermometer"]
    assert names == simulator_names and len(names) == 29
    assert simulator.env.get_task_names()[29] == "use-thermometer"
    assert tuple(names[i] for i in HELDOUT_INDICES) == HELDOUT_TASKS


@pytest.mark.sciworld
@pytest.mark.parametrize("name", ["boil", "identify-life-stages-2", "power-component"])
def test_split_sizes_match_the_simulator(suite, simulator, name):
    simulator.env.load(name, 0, "")
    expected = {
        "train": simulator.env.get_variations_train(),
        "iid": simulator.env.get_variations_dev(),
        "ood": simulator.env.get_variations_test(),
    }
    for split, variations in expected.items():
        got = [t.variation for t in suite.tasks(split) if t.name == name]
        assert got == variations and got, split


@pytest.mark.sciworld
def test_train_iid_ood_are_disjoint_and_cover_the_tasks(suite):
    splits = {s: {(t.name, t.variation) for t in suite.tasks(s)} for s in ("train", "iid", "ood")}
    assert not splits["train"] & splits["iid"]
    assert not splits["train"] & splits["ood"]
    assert not splits["iid"] & splits["ood"]
    assert all(t.split == "ood" for t in suite.tasks("ood"))
    for names in ({n for n, _ in pairs} for pairs in splits.values()):
        assert len(names) == 29 and "use-thermometer" not in names


@pytest.mark.sciworld
def test_heldout_level_keeps_heldout_tasks_out_of_training(suite):
    level = SciWorldSuite(split_level="heldout")
    for split in ("train", "iid", "ood"):
        assert not {t.name for t in level.tasks(split)} & set(HELDOUT_TASKS)
    heldout = level.tasks("heldout")
    assert {t.name for t in heldout} == set(HELDOUT_TASKS)
    standard_ood = {(t.name, t.variation) for t in suite.tasks("ood") if t.name in HELDOUT_TASKS}
    assert {(t.name, t.variation) for t in heldout} == standard_ood
    train_pairs = {(t.name, t.variation) for t in level.tasks("train")}
    assert train_pairs == {(t.name, t.variation) for t in suite.tasks("train") if t.name not in HELDOUT_TASKS}


def _java_children() -> list[str]:
    ps = subprocess.run(["ps", "-o", "pid=,comm=", "--ppid", str(os.getpid())], capture_output=True, text=True)
    return [line for line in ps.stdout.splitlines() if "java" in line]


@pytest.mark.sciworld
def test_suite_pickles_and_leaves_no_jvm_behind():
    before = _java_children()
    suite = SciWorldSuite(split_level="heldout")
    tasks = suite.tasks("heldout")
    copy = pickle.loads(pickle.dumps(suite))
    assert copy.tasks("heldout") == tasks and copy.split_level == "heldout"
    assert _java_children() == before


# --- episodes ----------------------------------------------------------------------------------


@pytest.mark.sciworld
def test_reset_info_shows_task_templates_and_objects(env):
    observation, info = env.reset(Task("iid", "find-living-thing", 150))
    assert observation.startswith("This room is called")
    assert info["task"].startswith("find a(n) living thing") and not info["won"]
    actions = info["admissible_actions"]
    assert "look around" in actions and "pick up OBJ" in actions
    assert actions[-1].startswith("OBJ needs to be replaced with one of the following objects: [")
    assert "'agent'" in actions[-1]
    assert info["expert_action"] is not None


@pytest.mark.sciworld
def test_invalid_action_is_flagged_and_the_episode_goes_on(env):
    env.reset(Task("train", "find-plant", 0))
    observation, reward, done, info = env.step("fly to the moon")
    assert observation == "No known action matches that input."
    assert info["action_valid"] is False and not done and reward == 0.0 and not info["won"]
    observation, _, done, info = env.step("look around")
    assert info["action_valid"] is True and not done and observation.startswith("This room")


@pytest.mark.sciworld
@pytest.mark.parametrize("task", [Task("train", "find-non-living-thing", 0), Task("ood", "power-component", 15)])
def test_gold_path_wins_with_reward_only_on_the_winning_step(env, task):
    steps = _play_gold(env, task)
    *before, (last_reward, last_done, last_info) = steps
    assert last_info["won"] and last_done and last_reward == 10.0 and last_info["score"] == 100
    assert all(reward == 0.0 and not info["won"] and not done for reward, done, info in before)


@pytest.fixture(scope="module")
def scored_env():
    """An env whose reward also pays ScienceWorld's score progress (``env.suite.score_reward``), made by its suite."""
    env = SciWorldSuite(gold_path=True, score_reward=10.0).make_env()
    yield env
    env.close()


@pytest.mark.sciworld
def test_score_reward_pays_each_step_its_score_progress_and_the_win_on_top(scored_env):
    _, info = scored_env.reset(Task("train", "find-plant", 0))
    scores, rewards = [info["score"]], []
    for reward, _, step_info in follow_expert(scored_env, info, 250):
        scores.append(step_info["score"])
        rewards.append(reward)
    assert len(set(scores)) > 3  # the gold path makes progress in several steps, not only at the win
    progress = [10.0 * (after - before) / 100 for before, after in zip(scores, scores[1:])]
    assert rewards[:-1] == pytest.approx(progress[:-1])
    assert rewards[-1] == pytest.approx(progress[-1] + 10.0)  # the win's success_reward on top
    assert sum(rewards) == pytest.approx(10.0 * (100 - scores[0]) / 100 + 10.0)


@pytest.mark.sciworld
def test_score_reward_takes_back_the_progress_when_the_task_fails(scored_env):
    _, info = scored_env.reset(Task("train", "find-plant", 0))
    start = info["score"]
    gained = 0.0
    for _ in range(2):  # the gold path's first two steps: from 8 to 17 in this variation
        _, reward, _, info = scored_env.step(info["expert_action"])
        gained += reward
    assert info["score"] > start and gained == pytest.approx(10.0 * (info["score"] - start) / 100)
    _, reward, done, info = scored_env.step("focus on agent")
    assert done and not info["won"] and info["score"] < 0
    assert gained + reward == pytest.approx(-10.0 * start / 100)  # a failure counts as score 0


@pytest.mark.sciworld
def test_with_failure_keeps_progress_a_failed_task_keeps_what_it_earned():
    """``env.suite.failure_keeps_progress``: the same two gold steps and wrong ``focus on`` as above; the failing step
    pays 0, so the episode keeps the two steps' progress (given back without the option)."""
    env = SciWorldSuite(gold_path=True, score_reward=10.0, failure_keeps_progress=True).make_env()
    try:
        _, info = env.reset(Task("train", "find-plant", 0))
        start, gained = info["score"], 0.0
        for _ in range(2):
            _, reward, _, info = env.step(info["expert_action"])
            gained += reward
        assert info["score"] > start and gained == pytest.approx(10.0 * (info["score"] - start) / 100)
        _, reward, done, info = env.step("focus on agent")
        assert done and not info["won"] and info["score"] < 0 and reward == 0.0
    finally:
        env.close()


def test_failure_keeps_progress_without_the_score_reward_is_refused_at_start():
    with pytest.raises(ConfigError, match="set env.suite.score_reward > 0"):
        SciWorldSuite(failure_keeps_progress=True)


@pytest.mark.sciworld
def test_deviating_from_the_gold_path_drops_the_expert(env):
    _, info = env.reset(Task("train", "find-non-living-thing", 0))
    gold_first = info["expert_action"]
    _, _, _, info = env.step("fly to the moon")  # rejected: the world did not change
    assert info["expert_action"] == gold_first
    _, _, _, info = env.step("inventory")
    assert info["expert_action"] is None


@pytest.mark.sciworld
def test_failing_the_task_ends_without_a_win(env):
    env.reset(Task("train", "find-plant", 0))
    _, reward, done, info = env.step("focus on agent")
    assert done and not info["won"] and reward == 0.0 and info["score"] < 0


@pytest.mark.sciworld
def test_simulator_step_cap_never_ends_or_wins_an_episode(env):
    env.reset(Task("train", "lifespan-longest-lived", 0))
    for _ in range(12):  # 'wait' counts 10 moves: 120 moves, past ScienceWorld's default cap of 100
        _, reward, done, info = env.step("wait")
        assert not done and not info["won"] and reward == 0.0


@pytest.mark.sciworld
def test_fresh_env_caps_its_heap_has_no_expert_and_closes_its_jvm():
    before = os.environ.get("JAVA_TOOL_OPTIONS")
    env = SciWorldEnv(jvm_heap_mb=300)
    pid = env.pid
    try:
        assert os.environ.get("JAVA_TOOL_OPTIONS") == before
        assert env._sim.env._gateway.jvm.java.lang.Runtime.getRuntime().maxMemory() <= 300 * 2**20
        _, info = env.reset(Task("train", "find-animal", 0))
        assert info["expert_action"] is None
        assert _alive(pid)
    finally:
        env.close()
    env.close()
    assert env.pid is None and not _alive(pid)
    with pytest.raises(RuntimeError, match="closed"):
        env.reset(Task("train", "boil", 0))


@pytest.mark.sciworld
@pytest.mark.slow
def test_gold_path_wins_nearly_every_task(suite, env):
    first_train = {}
    for task in suite.tasks("train"):
        first_train.setdefault(task.name, task)
    wins = [name for name, task in first_train.items() if _play_gold(env, task)[-1][2]["won"]]
    assert len(wins) >= 27, sorted(set(first_train) - set(wins))


@pytest.mark.sciworld
@pytest.mark.slow
def test_variations_file_of_another_version_is_listed_again(suite, tmp_path):
    path = tmp_path / "variations.json"
    path.write_text('{"scienceworld": "0.0", "tasks": {}}')
    remade = SciWorldSuite(variations_path=str(path))
    assert remade.tasks("ood") == suite.tasks("ood")
    assert f'"scienceworld":"{sciworld.scienceworld_version()}"' in path.read_text()
