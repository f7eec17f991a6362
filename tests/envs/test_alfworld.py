"""ALFWorld wrapper: unpacking, splits, data-dir errors, rewards, validity and the expert.

Everything is marked ``alfworld`` (needs the alfworld/textworld packages and the unpacked games);
the expert sweep over every task type of every split is also ``slow``.
"""

from __future__ import annotations

import importlib.util
import io
import os
import pickle
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from lightning_epo.envs.alfworld import SPLIT_FOLDERS, AlfWorldEnv, AlfWorldSuite
from lightning_epo.envs.alfworld_data import REPO_ROOT, resolve_data_dir, unpack_alfworld
from lightning_epo.envs.base import Task
from lightning_epo.envs.testing import follow_expert

pytestmark = pytest.mark.alfworld

if importlib.util.find_spec("alfworld") is None:
    pytest.skip("alfworld is not installed (pip install alfworld==0.4.2 textworld==1.7.0)", allow_module_level=True)

SPLIT_SIZES = {"train": 3553, "iid": 140, "ood": 134}
TASK_TYPES = {
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
}


@pytest.fixture(scope="module")
def suite() -> AlfWorldSuite:
    try:
        return AlfWorldSuite()
    except ValueError as err:
        pytest.skip(f"ALFWorld games missing: {err}")


@pytest.fixture(scope="module")
def env(suite):
    env = suite.make_env()
    yield env
    env.close()


def _play_expert(env: AlfWorldEnv, task: Task) -> list[tuple[float, bool, dict]]:
    return follow_expert(env, env.reset(task)[1], limit=60)


def _assert_wins_only_at_the_end(steps: list[tuple[float, bool, dict]]) -> None:
    assert steps, "the expert gave no action"
    *before, (last_reward, last_done, last_info) = steps
    assert (last_reward, last_done, last_info["won"]) == (10.0, True, True)
    assert last_info["expert_action"] is None
    for reward, done, info in before:
        assert (reward, done, info["won"], info["action_valid"]) == (0.0, False, False, True)


def _scene(task: Task) -> str:
    return Path(task.variation).parent.parent.name.rsplit("-", 1)[1]


def test_unpack_is_idempotent_and_leaves_no_temp_files(tmp_path):
    archive = tmp_path / "games.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        data = b'{"walkthrough": []}'
        member = tarfile.TarInfo("json_2.1.1/train/look_at_obj_in_light-Cd-None-DeskLamp-1/trial_T1/game.tw-pddl")
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))
    dest = tmp_path / "alfworld"
    assert unpack_alfworld(archive, dest) == dest
    assert len(list(dest.glob("json_2.1.1/train/*/*/game.tw-pddl"))) == 1
    archive.unlink()  # a second call must not need the archive
    assert unpack_alfworld(archive, dest) == dest
    assert [p.name for p in dest.iterdir() if p.name.startswith(".unpacking-")] == []


def test_unpack_rejects_a_wrong_archive(tmp_path):
    archive = tmp_path / "other.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        tar.addfile(tarfile.TarInfo("something_else.txt"), io.BytesIO(b""))
    with pytest.raises(ValueError, match="no json_2.1.1/"):
        unpack_alfworld(archive, tmp_path / "alfworld")
    assert list((tmp_path / "alfworld").iterdir()) == []
    with pytest.raises(FileNotFoundError, match="scripts/unpack_alfworld.py"):
        unpack_alfworld(tmp_path / "missing.tar.xz", tmp_path / "elsewhere")


def test_data_dir_resolution_order(tmp_path, monkeypatch):
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "from_env"))
    assert resolve_data_dir(tmp_path / "explicit") == tmp_path / "explicit"
    assert resolve_data_dir(None) == tmp_path / "from_env"
    monkeypatch.delenv("ALFWORLD_DATA")
    assert resolve_data_dir(None) == REPO_ROOT / "data" / "alfworld"


def test_missing_or_empty_data_fails_with_the_fix(tmp_path, monkeypatch, compose_cfg):
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    with pytest.raises(ValueError, match=r"python scripts/unpack_alfworld\.py.*ALFWORLD_DATA") as missing:
        AlfWorldSuite()
    named_key = re.search(r"set (env\.[\w.]+)", str(missing.value)).group(1)  # the hint's key exists in the config
    assert OmegaConf.select(compose_cfg("env=alfworld"), named_key, default="absent") != "absent", named_key
    (tmp_path / "json_2.1.1" / "train").mkdir(parents=True)
    empty = AlfWorldSuite()
    assert empty.data_dir == str(tmp_path)
    with pytest.raises(ValueError, match=r"no ALFWorld games .*train.*alfworld-download"):
        empty.tasks("train")
    with pytest.raises(ValueError, match=r"no ALFWorld games .*valid_seen"):
        empty.tasks("iid")
    with pytest.raises(ValueError, match=r"unknown ALFWorld split 'heldout'"):
        empty.tasks("heldout")


def test_split_sizes_types_and_order(suite):
    for split, size in SPLIT_SIZES.items():
        tasks = suite.tasks(split)
        assert len(tasks) == size
        assert {t.name for t in tasks} == TASK_TYPES
        assert all(t.split == split for t in tasks)
        assert [t.variation for t in tasks] == sorted(t.variation for t in tasks)
        assert all(str(t.variation).startswith(f"json_2.1.1/{SPLIT_FOLDERS[split]}/") for t in tasks)
        assert all(Path(t.variation).parent.parent.name.startswith(t.name + "-") for t in tasks)


def test_splits_are_disjoint_and_ood_rooms_are_unseen(suite):
    trials = {split: {Path(t.variation).parent.name for t in suite.tasks(split)} for split in SPLIT_SIZES}
    assert trials["train"].isdisjoint(trials["iid"])
    assert trials["train"].isdisjoint(trials["ood"])
    assert trials["iid"].isdisjoint(trials["ood"])
    train_scenes = {_scene(t) for t in suite.tasks("train")}
    assert {_scene(t) for t in suite.tasks("iid")} <= train_scenes
    assert {_scene(t) for t in suite.tasks("ood")}.isdisjoint(train_scenes)


def test_suite_pickles(suite):
    clone = pickle.loads(pickle.dumps(suite))
    assert clone.tasks("ood") == suite.tasks("ood")
    assert clone.data_dir == suite.data_dir


def test_reset_strips_banner_and_extracts_the_task(env, suite):
    observation, info = env.reset(suite.tasks("iid")[0])
    assert observation.startswith("You are in the middle of a room.")
    assert "Welcome to TextWorld" not in observation
    assert observation.endswith("Your task is to: " + info["task"])
    assert info["task"] and not info["task"].startswith("Your task")
    assert info["won"] is False
    assert "help" not in info["admissible_actions"]
    assert {"look", "inventory"} <= set(info["admissible_actions"])
    assert info["expert_action"] in info["admissible_actions"]


@pytest.mark.parametrize("split", sorted(SPLIT_SIZES))
def test_expert_wins_and_won_only_at_the_end(env, suite, split):
    _assert_wins_only_at_the_end(_play_expert(env, suite.tasks(split)[0]))


def test_invalid_action_keeps_the_episode_going(env, suite):
    _, info = env.reset(suite.tasks("ood")[0])
    expert, admissible = info["expert_action"], info["admissible_actions"]
    for action in ("fly to the moon", "help", "go to desk 99"):
        observation, reward, done, info = env.step(action)
        assert (info["action_valid"], reward, done, info["won"]) == (False, 0.0, False, False)
        assert observation == "Nothing happens." or action == "help"
        assert info["expert_action"] == expert and info["admissible_actions"] == admissible
    _, _, _, info = env.step("  " + expert.upper() + " ")  # case and spacing are normalised
    assert info["action_valid"] is True


def test_expert_stops_after_a_deviation(env, suite):
    _, info = env.reset(suite.tasks("iid")[0])
    expert = info["expert_action"]
    _, _, _, info = env.step("look")
    assert info["action_valid"] and info["expert_action"] is None
    _, _, _, info = env.step(expert)  # back on the walkthrough's first action: still off the plan
    assert info["action_valid"] and info["expert_action"] is None and not info["won"]


def test_engine_reuse_across_games_with_a_small_cache(suite):
    env = AlfWorldEnv(suite.data_dir, cache_size=1)
    try:
        first, second = suite.tasks("iid")[0], suite.tasks("ood")[0]
        observation_first, _ = env.reset(first)
        observation_second, _ = env.reset(second)
        assert observation_second != observation_first
        observation, info = env.reset(first)
        assert observation == observation_first
        assert len(env._engines) == 1
        _assert_wins_only_at_the_end(follow_expert(env, info, limit=60))
    finally:
        env.close()


def test_step_needs_a_running_episode(suite):
    env = AlfWorldEnv(suite.data_dir)
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("look")


def test_missing_game_file_names_the_fix(env, suite):
    with pytest.raises(ValueError, match="not found.*scripts/unpack_alfworld.py"):
        env.reset(Task("iid", "pick_and_place_simple", "json_2.1.1/valid_seen/nope/trial/game.tw-pddl"))


def test_importing_alfworld_leaves_alfworld_data_unset(tmp_path):
    code = (
        "import os; from lightning_epo.envs.alfworld import _make_engine; _make_engine(); "
        "print(os.environ.get('ALFWORLD_DATA'))"
    )
    environ = {k: v for k, v in os.environ.items() if k != "ALFWORLD_DATA"} | {"HOME": str(tmp_path)}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), environ.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "None"


@pytest.mark.slow
@pytest.mark.parametrize("split", sorted(SPLIT_SIZES))
def test_expert_wins_every_task_type(env, suite, split):
    tasks = suite.tasks(split)
    for task_type in sorted(TASK_TYPES):
        for task in [t for t in tasks if t.name == task_type][:2]:
            _assert_wins_only_at_the_end(_play_expert(env, task))
