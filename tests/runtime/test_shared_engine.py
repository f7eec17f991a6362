"""One vLLM engine for a warm-started run's two stages (runtime/shared_engine.py), against a fake engine class: the
real one is in tests/integration/test_vllm_train.py (marked vllm)."""

from __future__ import annotations

import pytest
from omegaconf import open_dict

import lightning_epo.rollout.vllm_engine as vllm_engine
from lightning_epo.rollout.engine import GenerationEngine
from lightning_epo.runtime.engine_choice import HF_ENGINE, VLLM_ENGINE
from lightning_epo.runtime.shared_engine import settings, shared_by_stages
from lightning_epo.runtime.warm_start import evaluated_on_run_engine, stage_overrides, start_from

RECIPES = ["smollm2_gridworld", "smollm2_alfworld"]


class FakeVLLMEngine(GenerationEngine):
    started: list[FakeVLLMEngine] = []

    def __init__(self, tokenizer, **settings):
        self.settings, self.closed, self.calls = settings, 0, []
        FakeVLLMEngine.started.append(self)

    def generate(self, prompts, sampling, infos=None):
        self.calls.append("generate")
        return []

    def sync_weights(self, actor):
        self.calls.append("sync_weights")

    def release_memory(self):
        self.calls.append("release_memory")

    def close(self):
        self.closed += 1


@pytest.fixture
def fake_vllm(monkeypatch):
    FakeVLLMEngine.started = []
    monkeypatch.setattr(vllm_engine, "VLLMEngine", FakeVLLMEngine)
    return FakeVLLMEngine


def stages(compose_cfg, experiment: str, tmp_path, *overrides: str):
    """The run ``experiment`` (with ``overrides``) and its warm start's stage, as run_warm_start composes it, and the
    run as it then starts (its model the stage's exported policy)."""
    run = compose_cfg(f"experiment={experiment}", *overrides)
    stage = compose_cfg(*stage_overrides(run, [f"experiment={experiment}", *overrides], tmp_path / "warm_start"))
    stage = evaluated_on_run_engine(stage, run)
    start_from(run, tmp_path / "warm_start" / "policy")
    return stage, run


@pytest.mark.parametrize("experiment", RECIPES)
def test_the_recipes_warm_start_evaluates_on_the_engine_rl_generates_with(compose_cfg, experiment, tmp_path):
    """The shipped recipes as they are: the stage's expert trains, vLLM evaluates its policy, with every setting of the
    engine RL then generates with (so that RL takes that engine over instead of starting its own)."""
    stage, run = stages(compose_cfg, experiment, tmp_path)
    assert stage.rollout.engine._target_ != VLLM_ENGINE  # the expert plays the training episodes
    assert stage.data.val_engine._target_ == VLLM_ENGINE
    assert stage.data.val_engine.model.name_or_path == stage.model.name_or_path  # the stage's own model
    assert run.data.engine.model.name_or_path.endswith("policy")
    assert settings(stage.data.val_engine) == settings(run.data.engine)


@pytest.mark.parametrize("experiment", RECIPES)
def test_on_the_hf_engine_the_warm_start_keeps_its_own_evaluation_engine(compose_cfg, experiment, tmp_path):
    stage, _ = stages(compose_cfg, experiment, tmp_path, "rollout=hf")
    assert stage.data.val_engine._target_ == HF_ENGINE


def test_one_engine_serves_both_stages_and_closes_when_the_command_ends(compose_cfg, fake_vllm, tmp_path):
    stage, run = stages(compose_cfg, "smollm2_gridworld", tmp_path)
    with shared_by_stages(run, None) as shared:
        with shared_by_stages(stage, shared) as given:
            assert given is shared  # the stage is given its run's
        evaluates = shared.datamodule_engines(stage.data)["val_engine"](tokenizer=None)
        evaluates.sync_weights(None), evaluates.generate([[1]], None), evaluates.close()  # the stage's teardown
        generates = shared.datamodule_engines(run.data)["engine"](tokenizer=None)
        generates.sync_weights(None)
        (engine,) = fake_vllm.started
        assert engine.closed == 0 and engine.calls == ["sync_weights", "generate", "sync_weights"]
        assert engine.settings["model"].name_or_path == stage.model.name_or_path  # started by the stage
        generates.close()
        assert engine.closed == 0
    assert engine.closed == 1


def test_an_rl_run_with_other_engine_settings_starts_its_own(compose_cfg, fake_vllm, tmp_path, caplog):
    stage, run = stages(compose_cfg, "smollm2_gridworld", tmp_path)
    with open_dict(run):
        run.rollout.engine.kv_cache_gib = 2
    with shared_by_stages(run, None) as shared:
        shared.datamodule_engines(stage.data)["val_engine"](tokenizer=None)
        with caplog.at_level("INFO", logger="lightning_epo.runtime.shared_engine"):
            shared.datamodule_engines(run.data)["engine"](tokenizer=None)
        first, second = fake_vllm.started
        assert first.closed == 1 and second.closed == 0 and second.settings["kv_cache_gib"] == 2
        assert "differs from this run's in kv_cache_gib" in caplog.text
    assert second.closed == 1


def test_the_shared_engine_closes_when_the_run_fails(compose_cfg, fake_vllm, tmp_path):
    stage, run = stages(compose_cfg, "smollm2_gridworld", tmp_path)
    with pytest.raises(KeyboardInterrupt), shared_by_stages(run, None) as shared:
        shared.datamodule_engines(stage.data)["val_engine"](tokenizer=None)
        raise KeyboardInterrupt  # a stage stopped by a signal
    assert fake_vllm.started[0].closed == 1


def test_runs_without_a_warm_start_or_a_vllm_engine_share_nothing(compose_cfg, tmp_path):
    with shared_by_stages(compose_cfg("rollout=vllm"), None) as shared:
        assert shared is None  # a run without a warm start: its DataModule owns its engine
    _, run = stages(compose_cfg, "smollm2_gridworld", tmp_path, "rollout=hf")
    with shared_by_stages(run, None) as shared:
        assert shared.datamodule_engines(run.data) == {}
