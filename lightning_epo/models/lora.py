"""LoRA adapters through PEFT (``model.lora``): the actor (and optionally the critic's backbone) trains low-rank
adapters on a frozen base model.

``model.lora`` keys (conf/config.yaml; LoRA is off while ``r`` is null):

- ``r``: the adapters' rank; null: no adapters, the models train in full.
- ``alpha``: an adapted layer computes ``W x + B A x * alpha / r``.
- ``dropout``: dropout on the adapters' input. Keep it 0 for RL: with dropout the old-policy pass is random, so
  PPO's importance ratio no longer starts at 1.
- ``target_modules``: ``all-linear`` (every linear layer but the output layer) or a list of module names,
  e.g. ``[q_proj, v_proj]``.
- ``critic``: give the critic's backbone adapters too (its value head still trains in full); false: the critic
  trains in full.
- ``top_layers``: adapters on the top N decoder layers only (null: every layer). No layer below them has a
  parameter that trains, so autograd records nothing there and the backward pass stops at the lowest adapted layer:
  the forward still runs through every layer (on SmolLM2, top 10 of 30 takes 0.56-0.57 of the every-layer update's
  time: benchmarks/lora_top_layers.py). The critic's backbone counts its own layers (``model.critic_layers``).

What one frozen base gives the rest of the trainer:

- The KL reference is the actor with its adapter disabled (``PeftModel.disable_adapter()``), not a second copy.
- Engines and exports that take transformers weights get :func:`merged_weights`: ``W + B A * alpha / r`` under
  the base model's own names, computed without touching the trainer's model (``merge_and_unload`` would).
- The adapters are initialised from the run's seed on every rank alike (and written into the gathered parameters
  under ZeRO-3, where PEFT's own initialisation would write into empty shards).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.tuners.lora import LoraLayer
from transformers.modeling_layers import GradientCheckpointingLayer

from lightning_epo.core.errors import UserError
from lightning_epo.models.shards import gathered

ADAPTER = "default"  # PEFT's name for a model's one adapter


def lora_settings(model_cfg: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ``model.lora`` node when LoRA is on (``r`` set), else None (also for a config without the node)."""
    lora = model_cfg.get("lora")
    return lora if lora is not None and lora.get("r") is not None else None


def add_lora(model: torch.nn.Module, lora: Mapping[str, Any], task_type: str | None) -> PeftModel:
    """``model`` with LoRA adapters on ``lora.target_modules``; only the adapters require gradients.

    ``task_type``: ``CAUSAL_LM`` for the actor, None for a headless backbone (the critic's).
    """
    target = lora["target_modules"]
    config = LoraConfig(
        r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
        target_modules=target if isinstance(target, str) else list(target), task_type=task_type,
        exclude_modules=_below_top_layers(model, lora.get("top_layers")),
    )
    try:
        peft_model = get_peft_model(model, config)
    except ValueError as exc:  # e.g. "Target modules {...} not found in the base model"
        raise UserError(
            f"model.lora.target_modules={target!r} does not fit this model ({str(exc).splitlines()[0]}): use "
            "all-linear or the names of its linear layers (e.g. [q_proj, k_proj, v_proj, o_proj])"
        ) from exc
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(torch.initial_seed())  # the run's seed, whatever loading drew before
        for layer in lora_layers(peft_model):
            with gathered([*layer.lora_A.parameters(), *layer.lora_B.parameters()], modifier_rank=0):
                layer.reset_lora_parameters(ADAPTER, init_lora_weights=True)
    return peft_model


def decoder_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """``(name, layer)`` of each decoder layer of ``model``, bottom first (transformers' ``GradientCheckpointingLayer``:
    ``model.layers.0``, ... in a causal LM, ``layers.0``, ... in a headless backbone)."""
    return [(name, module) for name, module in model.named_modules() if isinstance(module, GradientCheckpointingLayer)]


def _below_top_layers(model: torch.nn.Module, top_layers: int | None) -> str | None:
    """PEFT's ``exclude_modules`` for ``model.lora.top_layers``: a pattern of every module inside the decoder layers
    below the top ``top_layers`` (None where every layer is adapted)."""
    layers = decoder_layers(model)
    if top_layers is None or top_layers == len(layers):
        return None
    if not 1 <= top_layers <= len(layers):
        raise UserError(f"model.lora.top_layers={top_layers}: the model has {len(layers)} decoder layers; give a "
                        "number from 1 to that (or null for all)")
    below = "|".join(re.escape(name) for name, _ in layers[: len(layers) - top_layers])
    return rf"({below})\..*"


def is_lora(model: torch.nn.Module) -> bool:
    """Whether ``model`` carries PEFT adapters."""
    return isinstance(model, PeftModel)


def lora_layers(model: torch.nn.Module) -> list[LoraLayer]:
    """The adapted layers of ``model``."""
    return [module for module in model.modules() if isinstance(module, LoraLayer)]


def adapter_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The adapters' parameters (none for a model without adapters)."""
    return [param for layer in lora_layers(model) for adapters in (layer.lora_A, layer.lora_B)
            for param in adapters.parameters()]


def merged_weights(model: PeftModel, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for every weight of the base model with the adapters merged in (``W + B A * alpha / r``),
    under the base model's checkpoint names (``...q_proj.weight``, not ``...q_proj.base_layer.weight``); the
    adapters' own parameters are left out. The model is not changed.

    One adapted layer at a time: under ZeRO-3 its base weight and adapters are gathered together (every rank must
    run the whole iteration, as for :func:`~lightning_epo.models.weights.hf_weights`).
    """
    base = model.get_base_model()
    adapted = {name: layer for name, layer in base.named_modules() if isinstance(layer, LoraLayer)}
    for name, param in base.named_parameters():
        if ".base_layer." in name:  # an adapted layer's frozen base weight (or bias)
            layer_name, leaf = name.split(".base_layer.")
            layer = adapted[layer_name]
            with gathered([param, *layer.lora_A.parameters(), *layer.lora_B.parameters()]):
                tensor = param.detach()
                if leaf == "weight":
                    tensor = tensor + layer.get_delta_weight(ADAPTER).to(param.dtype)
                yield f"{layer_name}.{leaf}", tensor.to(dtype=dtype or param.dtype, copy=True)
        elif model.prefix not in name:  # PEFT's mark of an adapter's own parameter ("lora_"): those are left out
            with gathered([param]):
                yield name, param.detach().to(dtype=dtype or param.dtype, copy=True)
