"""Weight pushes into vLLM that every rank joins: ZeRO-3 on 2 CPU processes (torchrun, gloo), the real ``VLLMEngine``
over a stubbed ``vllm.LLM`` with sleep mode on (``vllm_push_worker.py``). A level-2 sleep discards the weights after
each rollout and each evaluation split; the push that follows gathers ZeRO-3 shards, so a rank with no episode of a
split must still push, at the same point as the others, or the ranks' collectives never pair up (a hang)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.distributed.test_ddp import launch

pytestmark = pytest.mark.deepspeed


def collections(calls: list[str]) -> list[list[str]]:
    """The engine's calls cut at its sleeps: one list per collection (a rollout or an evaluation split)."""
    cut: list[list[str]] = [[]]
    for call in calls:
        cut[-1].append(call)
        if call.startswith("sleep("):
            cut.append([])
    return cut


def test_a_rank_without_episodes_of_a_split_joins_every_push(tiny_model_path, tmp_path):
    launch("vllm_push_worker", tiny_model_path, tmp_path, timeout=300)  # a push only one rank makes hangs
    rank0, rank1 = (json.loads(Path(tmp_path, f"pushes-rank{r}.json").read_text()) for r in (0, 1))

    def joined(calls: list[str]) -> list[str]:  # what every rank does: pushes and sleeps, not its own generations
        return [c for c in calls if c not in ("generate", "wake_up(kv_cache)")]

    assert joined(rank0) == joined(rank1)
    # fit's start; after each of the 2 updates; after a sleep, at the start of rollout 1 and of each second split
    assert rank0.count("load_weights") == 6
    both = list(zip(collections(rank0), collections(rank1)))
    assert len(both) == 7 and both[-1] == (["shutdown"], ["shutdown"])  # 2 rollouts, 2 evaluations of 2 splits, close
    # the evaluation splits: rank 0 plays their one episode, rank 1 none, and each began with a push both made
    alone = [(c0, c1) for c0, c1 in both if "generate" in c0 and "generate" not in c1]
    assert len(alone) == 4 and all("load_weights" in c0 and "load_weights" in c1 for c0, c1 in alone)
