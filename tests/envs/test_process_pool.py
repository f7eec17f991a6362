"""ProcessEnvPool: parallel slots, failures contained per slot, and no process left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import lightning_epo
from lightning_epo.core.errors import ConfigError
from lightning_epo.envs.base import StepResult, TaskSuite
from lightning_epo.envs.gridworld import GridworldSuite
from lightning_epo.envs.process_pool import START_METHODS, ProcessEnvPool, default_pool_size
from lightning_epo.envs.testing import ScriptedSuite

CHILD = ["sleep", "1000"]  # stands in for a simulator's own process (ScienceWorld's JVM)
TASKS = ScriptedSuite().tasks("train")


def _running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (killed orphans may wait unreaped in containers)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _wait_gone(pids: list[int], timeout_s: float = 5.0) -> list[int]:
    """The pids still running after waiting up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while any(map(_running, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [pid for pid in pids if _running(pid)]


def _children() -> set[int]:
    """Running child processes of this process, except multiprocessing's own resource tracker."""
    children = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError):  # exited meanwhile
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == os.getpid() and fields[0] != "Z" and b"resource_tracker" not in cmdline:
            children.add(int(entry.name))
    return children


def _pids(results: list[StepResult]) -> list[int]:
    return [pid for result in results for pid in (result.info["worker_pid"], result.info["child_pid"])]


@pytest.fixture
def make_pool():
    pools: list[ProcessEnvPool] = []

    def make(suite: TaskSuite, size: int, **kwargs) -> ProcessEnvPool:
        pools.append(ProcessEnvPool(suite, size, **kwargs))
        return pools[-1]

    yield make
    for pool in pools:
        pool.close()


def test_slots_step_in_parallel_and_answer_in_order(make_pool):
    pool = make_pool(ScriptedSuite(step_s=0.3), 4)
    first = pool.reset([0, 1, 2, 3], TASKS)
    assert [r.observation for r in first] == [f"task echo {i}" for i in range(4)]
    assert len({r.info["worker_pid"] for r in first}) == 4

    start = time.monotonic()
    results = pool.step([3, 1, 0, 2], ["a3", "a1", "a0", "a2"])
    elapsed = time.monotonic() - start

    assert [r.observation for r in results] == ["echo: a3", "echo: a1", "echo: a0", "echo: a2"]
    assert [r.info["worker_pid"] for r in results] == [first[i].info["worker_pid"] for i in (3, 1, 0, 2)]
    assert not any(r.failed for r in results)
    assert elapsed < 0.9, f"4 steps of 0.3 s took {elapsed:.2f} s: the slots did not run in parallel"
    assert pool.failures == 0


@pytest.mark.parametrize("start_method", START_METHODS)
def test_worker_killed_from_outside_fails_its_slot_then_restarts(make_pool, start_method):
    pool = make_pool(ScriptedSuite(child_command=CHILD), 2, start_method=start_method)
    before = pool.reset([0, 1], TASKS[:2])
    os.kill(before[0].info["worker_pid"], signal.SIGKILL)

    results = pool.step([0, 1], ["a", "b"])

    assert results[0].failed and results[0].observation == ""
    assert results[0].info["error"] == "worker died (exit code -9)"
    assert results[1] == StepResult("echo: b", info=results[1].info)
    assert _wait_gone([before[0].info["child_pid"]]) == [], "the dead worker's simulator child was orphaned"
    after = pool.reset([0], TASKS[:1])[0]
    assert not after.failed and after.observation == "task echo 0"
    assert after.info["worker_pid"] != before[0].info["worker_pid"]
    assert pool.failures == 1


def test_worker_that_exits_during_a_step_is_reported_with_its_exit_code(make_pool):
    pool = make_pool(ScriptedSuite(), 1)
    pool.reset([0], TASKS[:1])
    assert pool.step([0], ["die"])[0].info["error"] == "worker died (exit code 3)"
    assert pool.step([0], ["a"])[0].observation == "echo: a"


def test_hanging_step_times_out_without_holding_up_other_slots(make_pool):
    pool = make_pool(ScriptedSuite(child_command=CHILD), 3, step_timeout_s=1.0)
    before = pool.reset([0, 1, 2], TASKS[:3])

    start = time.monotonic()
    results = pool.step([0, 1, 2], ["a", "hang", "c"])
    elapsed = time.monotonic() - start

    assert 1.0 <= elapsed < 2.0, f"a 1 s timeout took {elapsed:.2f} s"
    assert results[1].failed and results[1].info["error"] == "timeout after 1s"
    assert [results[0].observation, results[2].observation] == ["echo: a", "echo: c"]
    assert _wait_gone(_pids(before[1:2])) == [], "the hung worker or its child survived"
    assert not pool.reset([1], TASKS[1:2])[0].failed
    assert pool.failures == 1


def test_exception_in_env_fails_the_step_and_rebuilds_the_env_in_the_same_worker(make_pool):
    pool = make_pool(ScriptedSuite(), 2)
    before = pool.reset([0, 1], TASKS[:2])

    results = pool.step([0, 1], ["raise", "b"])

    assert results[0].failed and results[0].info["error"] == "RuntimeError: scripted failure"
    assert results[1].observation == "echo: b"
    after = pool.reset([0], TASKS[:1])[0]
    assert after.info["worker_pid"] == before[0].info["worker_pid"]
    assert after.info["instance"] == before[0].info["instance"] + 1
    assert pool.failures == 1


def test_close_leaves_no_process_behind_and_is_idempotent(make_pool):
    children_before = _children()
    pool = make_pool(ScriptedSuite(child_command=CHILD), 2)
    results = pool.reset([0, 1], TASKS[:2])
    assert all(map(_running, _pids(results)))

    pool.close()
    pool.close()

    assert _wait_gone(_pids(results)) == []
    assert _children() - children_before == set()
    with pytest.raises(RuntimeError, match="closed"):
        pool.step([0], ["a"])


def test_gridworld_plays_the_same_through_the_pool_as_in_process(make_pool):
    suite = GridworldSuite(num_train_tasks=2, num_eval_tasks=1)
    tasks = suite.tasks("train")
    local = [suite.make_env() for _ in tasks]
    pool = make_pool(suite, 2)
    results = pool.reset([0, 1], tasks)
    assert [(r.observation, r.info) for r in results] == [env.reset(task) for env, task in zip(local, tasks)]
    while not all(r.done for r in results):
        slots = [slot for slot, r in enumerate(results) if not r.done]
        actions = [results[slot].info["expert_action"] for slot in slots]
        for slot, action, result in zip(slots, actions, pool.step(slots, actions)):
            assert (result.observation, result.reward, result.done, result.info) == local[slot].step(action)
            results[slot] = result
    assert all(r.info["won"] for r in results)
    assert pool.failures == 0


PARENT_SCRIPT = """
import json, os, signal, sys, threading, time
from lightning_epo.envs.process_pool import ProcessEnvPool
from lightning_epo.envs.testing import ScriptedSuite

pool = ProcessEnvPool(ScriptedSuite(child_command=["sleep", "1000"]), 2)
results = pool.reset([0, 1], ScriptedSuite().tasks("train")[:2])
print(json.dumps([pid for r in results for pid in (r.info["worker_pid"], r.info["child_pid"])]), flush=True)
if sys.argv[1] == "killed_mid_step":
    threading.Thread(target=pool.step, args=([0, 1], ["hang", "hang"]), daemon=True).start()
    time.sleep(0.3)
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("how", ["exits_without_close", "killed_mid_step"])
def test_workers_and_their_children_die_with_the_trainer(how, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(lightning_epo.__file__).parents[1])}
    output = tmp_path / "pids.json"
    with output.open("w") as stdout:  # a file, not a pipe: surviving workers would hold a pipe open
        subprocess.run([sys.executable, "-c", PARENT_SCRIPT, how], env=env, stdout=stdout, timeout=60)
    pids = json.loads(output.read_text().splitlines()[0])
    assert len(pids) == 4
    left = _wait_gone(pids)
    for pid in left:  # don't leak them into the rest of the session when this test fails
        os.kill(pid, signal.SIGKILL)
    assert left == [], f"left behind after the trainer {how}: {left} of {pids}"


def test_default_pool_size_is_one_slot_per_usable_core():
    assert default_pool_size(None) == len(os.sched_getaffinity(0))
    assert default_pool_size(3) == 3
    for bad in (0, -1, 2.0, "2", True):
        with pytest.raises(ConfigError, match="positive integer"):
            default_pool_size(bad)


def test_bad_arguments_fail_with_one_clear_line(make_pool):
    class LocalSuite(ScriptedSuite):
        pass

    with pytest.raises(TypeError, match="LocalSuite must be picklable"):
        ProcessEnvPool(LocalSuite(), 1)
    with pytest.raises(ConfigError, match="step_timeout_s must be > 0"):
        ProcessEnvPool(ScriptedSuite(), 1, step_timeout_s=0)
    with pytest.raises(ConfigError, match="start_method must be one of"):
        ProcessEnvPool(ScriptedSuite(), 1, start_method="thread")
    pool = make_pool(ScriptedSuite(), 2)
    with pytest.raises(ValueError, match="distinct integers in \\[0, 2\\)"):
        pool.step([0, 0], ["a", "b"])
    with pytest.raises(ValueError, match="distinct integers"):
        pool.step([2], ["a"])
    with pytest.raises(ValueError, match="one per slot"):
        pool.reset([0, 1], TASKS[:1])


@pytest.mark.parametrize("start_method", START_METHODS)
def test_workers_ignore_ctrl_c_meant_for_the_trainer(make_pool, start_method):
    """A terminal's Ctrl+C asks the trainer to finish its RL step (lightning_epo/runtime/preemption.py) and then close
    the pool: the workers and their children must live until then."""
    pool = make_pool(ScriptedSuite(child_command=CHILD), 2, start_method=start_method)
    before = pool.reset([0, 1], TASKS[:2])
    for pid in _pids(before):
        os.kill(pid, signal.SIGINT)
    time.sleep(0.5)

    results = pool.step([0, 1], ["a", "b"])

    assert [r.observation for r in results] == ["echo: a", "echo: b"]
    assert [r.info["worker_pid"] for r in results] == [r.info["worker_pid"] for r in before]
    assert all(map(_running, _pids(before))) and pool.failures == 0
    pool.close()
    assert _wait_gone(_pids(before)) == [], "closing the pool left a worker or its child behind"
