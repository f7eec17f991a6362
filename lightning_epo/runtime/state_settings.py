"""The settings that fix a checkpoint's state (which tensors it holds and what they mean), recorded in every
checkpoint (``checkpoint["state_settings"]``, written by :class:`~lightning_epo.training.module.EPOModule`) and
compared at start with the run's: a ``ckpt_path`` saved with other settings is refused in one line naming each
differing key, where loading it would end in tens of lines of missing, unexpected or mis-shaped state-dict keys.

- the model's architecture as its ``config.json`` gives it (type, sizes, vocabulary), not its path: a moved copy of
  the model, or a warm start's exported policy, is the same model;
- LoRA: ``model.lora.r``, and while it is set ``model.lora.target_modules``, ``model.lora.critic`` and
  ``model.lora.top_layers``;
- ``algo.critic`` (a critic and its optimizer state; with one, ``model.critic_layers`` where set) and the frozen
  reference model (``algo.kl_coef > 0``, without
  LoRA, whose adapter-free base serves as the reference);
- DeepSpeed's ZeRO stage (``trainer.strategy.stage``, null without DeepSpeed): a stage's checkpoint is a directory of
  shards in its own layout.

What cannot be known is left out (the architecture of a hub model that is not in the cache), and only the keys both
sides hold are compared; a checkpoint that records none (written before they were recorded) is left to the loader.
"""

from __future__ import annotations

import json
from pathlib import Path

from huggingface_hub import try_to_load_from_cache
from omegaconf import DictConfig, ListConfig, OmegaConf

from lightning_epo.core.errors import ConfigError
from lightning_epo.models.loading import model_source, uses_reference
from lightning_epo.models.lora import lora_settings
from lightning_epo.runtime.config import DEEPSPEED_FACTORY
from lightning_epo.training.checkpoint_io import recorded_state_settings

ARCHITECTURE = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "vocab_size")


def _model_config(model: DictConfig) -> dict:
    """The model's ``config.json`` (from its directory, or the Hugging Face cache for a hub id); {} when absent."""
    source, is_local = model_source(model)
    path = Path(source) / "config.json" if is_local else try_to_load_from_cache(source, "config.json",
                                                                                revision=model.get("revision"))
    return json.loads(Path(path).read_text()) if isinstance(path, (str, Path)) and Path(path).is_file() else {}


def state_settings(cfg: DictConfig) -> dict[str, object]:
    """``{key: value}`` of the run's settings that fix its checkpoint's state (plain values: a safe load reads them)."""
    config = _model_config(cfg.model)
    settings: dict[str, object] = {f"model architecture {field}": config[field] for field in ARCHITECTURE
                                   if field in config}
    lora = lora_settings(cfg.model)
    settings["model.lora.r"] = None if lora is None else lora.r
    if lora is not None:
        targets = lora.target_modules
        settings["model.lora.target_modules"] = OmegaConf.to_container(targets) if isinstance(targets, ListConfig) \
            else targets
        settings["model.lora.critic"] = lora.critic
        settings["model.lora.top_layers"] = lora.get("top_layers")  # null (every layer) recorded too: it differs
    settings["algo.critic"] = cfg.algo.critic
    if cfg.algo.critic and cfg.model.get("critic_layers") is not None:  # absent before the key: a whole critic
        settings["model.critic_layers"] = cfg.model.critic_layers
    settings["algo.kl_coef > 0"] = uses_reference(cfg.model, cfg.algo.kl_coef)
    strategy = cfg.trainer.get("strategy")
    deepspeed = isinstance(strategy, DictConfig) and strategy.get("_target_") == DEEPSPEED_FACTORY
    settings["trainer.strategy.stage"] = strategy.stage if deepspeed else None
    return settings


def _shown(value: object) -> str:
    """A value as the command line writes it: null, true / false, lists in brackets."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return f"[{','.join(map(str, value))}]" if isinstance(value, list) else str(value)


def check_checkpoint_settings(ckpt_path: str | None, settings: dict[str, object]) -> None:
    """Refuse, in one line naming each differing key and the fix, a checkpoint saved with other ``settings``."""
    saved = recorded_state_settings(Path(ckpt_path)) if ckpt_path is not None else None
    if saved is None:
        return
    differing = [f"{key}: {_shown(saved[key])} (this run: {_shown(value)})" for key, value in settings.items()
                 if key in saved and saved[key] != value]
    if differing:
        raise ConfigError(
            f"ckpt_path '{ckpt_path}' was saved with other settings: {'; '.join(differing)}: resume with the settings "
            "it was saved with, or start a new run from its weights (warm_start, or a run with export_policy=true "
            "and then model.name_or_path=<its run>/policy)"
        )
