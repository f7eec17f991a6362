"""DDP on CPU (gloo, 2 processes launched by torchrun): the same update as one process, the same H̄ everywhere.

One torchrun launch (``ddp_worker.py``) runs every distributed job of this file; the tests read its outputs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil  # a DeepSpeed requirement
import pytest
import torch
from safetensors.torch import load_file

from tests.distributed.ddp_worker import ALGOS, SGD, compose_cfg, train_fixed

REPO = Path(__file__).resolve().parents[2]


def launch(worker: str, model_dir: str, out: Path, timeout: float) -> None:
    """``python -m tests.distributed.<worker> MODEL_DIR OUT`` on 2 CPU processes (torchrun, gloo). Past
    ``timeout`` seconds (a collective that never pairs up hangs) every process is killed and the test fails."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", f"tests.distributed.{worker}", model_dir, str(out)]
    with subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as process:
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for worker_process in psutil.Process(process.pid).children(recursive=True):  # each in a session of its own
                worker_process.kill()
            process.kill()
            output, _ = process.communicate()
            pytest.fail(f"{worker} still running after {timeout:.0f} s (a hang):\n{output[-4000:]}")
    assert process.returncode == 0, output[-4000:]


@pytest.fixture(scope="module")
def ddp_outputs(tiny_model_path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ddp")
    launch("ddp_worker", tiny_model_path, out, timeout=600)
    return out


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


def assert_same_update(run: dict, reference: dict, metrics: tuple[str, ...]) -> None:
    """``run``'s logged ``metrics`` and every parameter equal ``reference``'s (rel 1e-5)."""
    for key in metrics:
        assert run["metrics"][key] == pytest.approx(reference["metrics"][key], rel=1e-5, abs=1e-7), key
    assert run["params"].keys() == reference["params"].keys()
    for name, value in reference["params"].items():
        torch.testing.assert_close(run["params"][name], value, rtol=1e-5, atol=1e-6, msg=name)


def assert_actor_moved(run: dict, model_dir: str) -> None:
    """The update changed the actor, so an equality of parameters covered a real step."""
    initial = load_file(str(Path(model_dir) / "model.safetensors"))
    assert [n for n, p in initial.items() if not torch.equal(run["params"][f"actor.{n}"], p)]


@pytest.mark.parametrize("algo", ALGOS)
def test_two_ranks_make_the_single_process_update(ddp_outputs, tiny_model_path, tmp_path, algo):
    """Rank r holds half of the trajectories; with SGD the update is linear in the gradient, so the
    parameters after two RL steps (the second with an entropy window) and the logged losses must match
    one process that holds all trajectories."""
    single = train_fixed(compose_cfg(tiny_model_path, str(tmp_path), f"algo={algo}", *SGD), world=1)
    ranks = [load(ddp_outputs / f"fixed-{algo}-rank{r}.pt") for r in (0, 1)]
    assert "loss/smooth" in single["metrics"]  # the second step used L_smooth
    for rank in ranks:
        assert rank["window"] == pytest.approx(single["window"], rel=1e-5)
        keys = ("loss/policy", "loss/entropy", "loss/smooth", "loss/total", "epo/entropy_ref")
        assert_same_update(rank, single, keys)
    assert_actor_moved(single, tiny_model_path)


def test_gridworld_ranks_share_the_entropy_window_and_weights(ddp_outputs):
    """``trainer=ddp`` on CPU: each rank plays its own tasks, yet H̄, the window and the weights agree."""
    rank0, rank1 = (load(ddp_outputs / f"gridworld-rank{r}.pt") for r in (0, 1))
    assert rank0["first_prompts"] != rank1["first_prompts"]  # each rank collected its own episodes
    # identity is the point: every rank holds the same all-reduce's output and applies it with the same elementwise
    # optimizer step, so replicas agree bit for bit on any CPU (replicas apart by rounding would drift apart)
    assert len(rank0["window"]) == 2 and rank0["window"] == rank1["window"]
    assert rank0["entropy_refs"] == rank1["entropy_refs"] and rank0["entropy_refs"][1] is not None
    for name, value in rank0["params"].items():
        assert torch.equal(value, rank1["params"][name]), name
