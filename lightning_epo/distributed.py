"""What the update needs to know about Lightning's strategy: DDP / DeepSpeed gradient accumulation, and
the full weights of ZeRO-3's sharded parameters.

One optimizer step of the module accumulates several backward passes (micro-batches). Both DDP and
DeepSpeed ZeRO reduce gradients across ranks inside ``backward``, so

- every rank must run the same number of backward passes per optimizer step (the module pads a rank
  with fewer micro-batches with zero-weight passes; under ZeRO-3 every forward all-gathers the shards,
  so no-grad passes are padded too), and
- only the last pass of an optimizer step needs to communicate: DDP skips the all-reduce of the others
  (``no_sync`` through Lightning's ``block_backward_sync``; the final all-reduce averages the
  accumulated gradients), DeepSpeed is told where its accumulation boundary is.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Any, Iterator

import torch
from lightning.pytorch.strategies import DeepSpeedStrategy, ParallelStrategy, Strategy
from transformers import PreTrainedModel


def is_deepspeed(strategy: Strategy) -> bool:
    """Whether DeepSpeed owns the optimizer step (its own gradient clipping and overflow handling)."""
    return isinstance(strategy, DeepSpeedStrategy)


def zero_stage(strategy: Strategy) -> int:
    """The DeepSpeed ZeRO stage (0 without DeepSpeed)."""
    if not is_deepspeed(strategy):
        return 0
    return int((strategy.config or {}).get("zero_optimization", {}).get("stage", 0))


@contextmanager
def accumulation_boundary(strategy: Strategy, last: bool) -> Iterator[None]:
    """Run one backward pass of an optimizer step; ``last`` marks the pass that reduces across ranks.

    DDP: passes before the last skip the gradient all-reduce (they accumulate locally); the last one
    averages the accumulated gradients over ranks. DeepSpeed: sets the engine's accumulation boundary
    (``engine.step()`` after the last pass applies the update). One process: nothing to do.

    DeepSpeed's ZeRO optimizer advances its accumulation state (ZeRO-3: ``micro_step_id``, without which
    each backward pass overwrites the previous one's gradients instead of adding to them; ZeRO-2: the
    per-pass gradient buffers) in ``clear_backward_seen_flag()``, which ``engine.forward()`` calls first.
    Lightning runs the whole ``training_step`` inside one ``engine.forward()``, and the module calls the
    actor and critic directly, so each pass calls it here. (Routing every micro-batch through
    ``engine.forward()`` instead would nest the engine's forward in itself.) An internal API: DeepSpeed is
    pinned, and tests/distributed/test_deepspeed.py compares ZeRO-2/3 with DDP over several micro-batches.
    """
    if is_deepspeed(strategy):
        engine = strategy.deepspeed_engine
        engine.optimizer.clear_backward_seen_flag()
        engine.set_gradient_accumulation_boundary(last)
        yield
    elif not last and isinstance(strategy, ParallelStrategy):
        with strategy.block_backward_sync():
            yield
    else:
        yield


def hf_zero3_config(strategy: Strategy) -> Any | None:
    """Under ZeRO-3, a live ``HfDeepSpeedConfig`` so that ``from_pretrained`` loads weights straight into
    DeepSpeed's parameter shards (transformers reads it through a weak reference: keep the returned object
    alive for the whole run). None otherwise."""
    if zero_stage(strategy) != 3:
        return None
    from transformers.integrations import HfDeepSpeedConfig

    return HfDeepSpeedConfig(strategy.config)


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
    from lightning_epo.models.lora import is_lora, merged_weights  # lora.py builds on gathered() above

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
