"""A hub model's shape with random weights, for checks of speed and memory where its weights cannot travel
(``make gpu-check``): the model's own ``config.json`` (``data/model_shapes/<model>/config.json``), weights drawn at
its dtype, and the tiny model's tokenizer (Qwen2.5's chat template; its ids are a subset of any vocabulary this
size), saved where ``model.name_or_path`` loads it through the same ``from_pretrained`` path as the real model.
The model writes noise: it rarely stops before ``rollout.max_new_tokens``, so every answer is as long as the cap.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from lightning_epo.models.export import staged_directory
from lightning_epo.models.tiny import (ENDOFTEXT, RECORDED_BUILD_SETTINGS, TOKENIZER_CORPUS, build_tokenizer,
                                      stop_at_chat_end)

SHAPES = Path(__file__).resolve().parents[2] / "data" / "model_shapes"


def build_shaped_model(config_dir: Path, path: Path, *, dtype: torch.dtype = torch.bfloat16, seed: int = 0,
                       device: str = "cpu") -> Path:
    """Save a model of ``config_dir``'s ``config.json`` with random weights (``dtype``, drawn on ``device``: a GPU
    draws a 1.5B model in seconds) and the tiny tokenizer under ``path``; returns ``path``. A model already at
    ``path`` is kept (built by an earlier check). Written atomically, as the tiny model is."""
    if (path / "config.json").is_file():
        return path
    config = AutoConfig.from_pretrained(config_dir)
    tokenizer = build_tokenizer(TOKENIZER_CORPUS, RECORDED_BUILD_SETTINGS["vocab_size"])
    config.bos_token_id = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    config.eos_token_id, config.pad_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    with staged_directory(path) as staging, torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        stop_at_chat_end(model, tokenizer)
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
    return path
