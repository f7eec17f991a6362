"""A rollout survives simulator crashes and hangs: the episode is truncated and counted, the run goes on,
and no process is left behind (the environment pool)."""

from __future__ import annotations

import os
import time

from lightning_epo.envs.process_pool import ProcessEnvPool
from lightning_epo.envs.testing import ScriptedSuite
from lightning_epo.rollout.collector import EpisodeCollector
from lightning_epo.rollout.engine import Generation, GenerationEngine, SamplingParams
from lightning_epo.rollout.prompts import PromptBuilder


class ActionByTask(GenerationEngine):
    """Plays ``actions[variation]`` on every turn of the task with that variation."""

    def __init__(self, tokenizer, actions: dict[int, str]):
        self.tokenizer, self.actions = tokenizer, actions

    def generate(self, prompts, sampling, infos=None):
        out = []
        for info in infos:
            variation = int(info["task"].split()[-1])
            ids = self.tokenizer.encode(f"<action>{self.actions[variation]}</action>", add_special_tokens=False)
            out.append(Generation(ids + [self.tokenizer.eos_token_id], [0.0] * (len(ids) + 1), "stop"))
        return out


def _cmdline(pid: str) -> str:
    try:
        return open(f"/proc/{pid}/cmdline").read()
    except OSError:
        return ""


def children_of(pid: int) -> list[int]:
    """Live (non-zombie) processes whose parent is ``pid``, and their descendants; multiprocessing's own
    resource tracker (one per interpreter, kept for its lifetime) does not count."""
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == parent and stat[0] != "Z" and "resource_tracker" not in _cmdline(entry):
                found.append(int(entry))
                frontier.append(int(entry))
    return found


def test_crash_and_hang_truncate_episodes_count_failures_and_leave_no_process(tokenizer):
    already_there = set(children_of(os.getpid()))  # e.g. a wandb service left by an earlier test
    suite = ScriptedSuite(num_tasks=3, hang_s=600.0, child_command=["sleep", "600"])
    pool = ProcessEnvPool(suite, size=3, step_timeout_s=3.0)
    engine = ActionByTask(tokenizer, {0: "walk", 1: "die", 2: "hang"})
    collector = EpisodeCollector(pool, engine, tokenizer, PromptBuilder("gridworld", think=False), max_turns=4)
    start = time.monotonic()
    rollout = collector.collect(suite.tasks("train"), [0, 1, 2], SamplingParams(max_new_tokens=16))
    assert time.monotonic() - start < 60
    walk, crash, hang = rollout.episodes
    assert walk.num_turns == 4 and walk.truncated  # the healthy episode ran to the turn limit
    assert crash.truncated and hang.truncated and crash.num_turns == hang.num_turns == 1
    assert rollout.stats["env_failures"] == 2
    # the pool restarted the two workers: a second rollout works on every slot
    again = collector.collect(suite.tasks("train")[:1] * 3, [0, 1, 2], SamplingParams(max_new_tokens=16))
    assert all(ep.num_turns == 4 for ep in again.episodes)
    pool.close()
    deadline = time.monotonic() + 10
    while set(children_of(os.getpid())) - already_there and time.monotonic() < deadline:
        time.sleep(0.2)
    assert set(children_of(os.getpid())) - already_there == set()
