"""Shared fixtures: the tiny model (built once per session), composed Hydra configs, the vLLM tests' setting."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, open_dict

from lightning_epo.runtime.resolvers import register_resolvers

REPO = Path(__file__).resolve().parents[1]
register_resolvers()  # the configs' own resolvers (${native_bf16:...}), as train.py registers them before composing


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> str:
    from lightning_epo.models.tiny import build_tiny_model

    path = tmp_path_factory.mktemp("models") / "tiny"
    build_tiny_model(path)
    return str(path)


@pytest.fixture
def compose_cfg(tiny_model_path, tmp_path):
    """Compose ``conf/config.yaml`` with overrides (its bare defaults, ``~experiment``, unless they name an
    experiment), pointing the model at the session's tiny model and the run directory at ``tmp_path / "run"``."""

    def make(*overrides: str) -> DictConfig:
        bare = [] if any(o.startswith("experiment=") for o in overrides) else ["~experiment"]
        with initialize_config_dir(str(REPO / "conf"), version_base="1.3"):
            cfg = compose(
                "config",
                overrides=[*bare, f"model.name_or_path={tiny_model_path}", f"run_dir={tmp_path / 'run'}", *overrides],
            )
        with open_dict(cfg):
            cfg.pop("hydra", None)
        return cfg

    return make


@pytest.fixture(scope="session")
def vllm_env():
    """For the tests marked ``vllm``: skip without vLLM; set ``VLLM_CPU_CI_ENV=1``, with which vLLM's CPU backend
    skips its torch.compile and warm-up (an engine starts in about 3 s instead of about 50 s; same outputs)."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("needs vLLM: run with .venv-vllm/bin/python (make setup-vllm)")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_CPU_CI_ENV", "1")
        yield


@pytest.fixture
def gpu_machine(monkeypatch):
    """The start checks (``check_machine``) as on a CUDA node with vLLM and DeepSpeed installed and the hub models
    in reach (cached or downloadable)."""
    from lightning_epo.runtime import config

    monkeypatch.setattr(config.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(config.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(config, "check_hub_access", lambda model: None)
