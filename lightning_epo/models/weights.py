"""The full weights of a model whose parameters may be DeepSpeed ZeRO-3 shards: gathered one parameter at a
time for the vLLM push, the export and the hf engine's plain copy (merged weights for a LoRA model)."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Iterator

import torch
from transformers import PreTrainedModel


def gathered(params: list[torch.nn.Parameter], modifier_rank: int | None = None) -> Any:
    """Context in which ZeRO-3 shards hold their full parameters (every rank must enter it, in the same order).
    With ``modifier_rank``, what that rank writes into them is kept (broadcast and re-partitioned at exit);
    otherwise writes are lost. Without ZeRO-3 shards, nothing to do."""
    if not any(hasattr(param, "ds_id") for param in params):
        return nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=modifier_rank)


def hf_weights(model: torch.nn.Module, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for every parameter of a transformers model, in its own (checkpoint) naming.

    One parameter at a time: a ZeRO-3 shard is gathered, copied (cast to ``dtype``) and released before the
    next, so the peak extra memory is one parameter (plus what the caller keeps). Tied weights appear once
    (``named_parameters`` deduplicates them). Buffers (rotary tables) are not weights and are left out.
    Under ZeRO-3 every rank must run the whole iteration. A model with LoRA adapters gives its merged weights
    under the base model's names (:func:`lightning_epo.models.lora.merged_weights`).
    """
    from lightning_epo.models.lora import is_lora, merged_weights  # lora.py builds on gathered() above: imported here

    if is_lora(model):
        yield from merged_weights(model, dtype)
        return
    for name, param in model.named_parameters():
        with gathered([param]):
            yield name, param.detach().to(dtype=dtype or param.dtype, copy=True)


def local_values(param: torch.nn.Parameter) -> torch.Tensor:
    """The values of ``param`` this rank holds: the whole parameter, or under ZeRO-3 its shard without the padding
    (the last shard is padded with uninitialised memory, which may hold anything, NaN included)."""
    shard = getattr(param, "ds_tensor", None)
    if shard is None:
        return param
    import torch.distributed as dist

    start = shard.ds_numel * dist.get_rank(group=param.ds_process_group)
    return shard.narrow(0, 0, min(shard.ds_numel, max(0, param.ds_numel - start)))


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model``'s parameters are DeepSpeed ZeRO-3 shards."""
    return any(hasattr(param, "ds_id") for param in model.parameters())


def gathered_copy(model: PreTrainedModel, into: PreTrainedModel | None = None) -> PreTrainedModel:
    """A plain (unsharded) copy of the ZeRO-3 transformers model ``model`` (weights and generation config, whose
    stop tokens the engines read), in eval mode; ``into``, a copy made before, is refreshed in place. Every
    rank must call it (see :func:`hf_weights`)."""
    if into is None or into is model:
        from lightning_epo.models.lora import is_lora

        base = model.get_base_model() if is_lora(model) else model  # LoRA: a plain copy of the merged model
        with torch.random.fork_rng(devices=[]):  # the copy's random init must not move the sampling RNG
            into = type(base)(base.config)
        into.generation_config = model.generation_config
    for name, tensor in hf_weights(model):
        into.get_parameter(name).data = tensor
    return into.to(tensor.device).eval()  # the buffers (rotary tables) join the weights' device
