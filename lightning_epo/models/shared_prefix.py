"""A micro-batch's common prefix computed once (``model.shared_prefix``).

Every row of an RL step starts with the same system prompt and instructions, and the rows of one group with the
same task: in gridworld_learn's batches the prefix all rows of a micro-batch share is 61-66 of their ~230 tokens.
:func:`decoder_hidden_states` runs the decoder on that prefix once (batch 1), then on each row's remainder with
the prefix's keys and values as a read-only cache expanded to the rows; gradients flow back into the prefix
through the cached keys and values (and the prefix's hidden states, which are broadcast back to every row). The
result equals the plain forward's (test: ``tests/models/test_shared_prefix.py``), so everything downstream (output
layer, value head, loss) is unchanged; only the decoder computes fewer tokens.

transformers drops a cache under gradient checkpointing (a layer that writes its cache would write it again on
the backward's replay). Both caches here are replay-safe (the prefix pass's records by assignment, the rows'
pass only reads), so while they run the decoder layers are told they may keep them
(``GradientCheckpointingLayer._can_checkpoint_with_cache``, transformers' switch for such caches).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from transformers.cache_utils import Cache, DynamicLayer
from transformers.modeling_layers import GradientCheckpointingLayer


class _RecordingLayer(DynamicLayer):
    """The prefix pass's cache layer: keeps the keys/values ``[1, h_kv, P, d_h]`` it is given (by assignment, so a
    gradient-checkpointing replay records again instead of appending) and returns them."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys, self.values = key_states, value_states
        return key_states, value_states


class _SharedPrefixLayer(DynamicLayer):
    """The rows' pass's cache layer: the prefix's keys/values ``[1, h_kv, P, d_h]`` expanded to ``rows`` and put
    before each call's new states ``[rows, h_kv, S, d_h]``; nothing is stored (replay-safe)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, rows: int) -> None:
        super().__init__()
        self.lazy_initialization(keys, values)
        self.keys, self.values, self.rows = keys, values, rows

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        keys = torch.cat([self.keys.expand(self.rows, -1, -1, -1), key_states], dim=-2)
        values = torch.cat([self.values.expand(self.rows, -1, -1, -1), value_states], dim=-2)
        return keys, values


def shared_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> int:
    """The leading columns of ``input_ids [N, L]`` in which every row holds the same real token
    (``attention_mask [N, L]`` 1), at most ``L - 1`` (the rows' own pass needs a column)."""
    same = (input_ids == input_ids[:1]).all(0) & attention_mask.bool().all(0)  # [L]
    differs = (~same).nonzero()
    return min(int(differs[0]) if len(differs) else len(same), len(same) - 1)


@contextmanager
def _cache_kept_under_checkpointing(decoder: torch.nn.Module) -> Iterator[None]:
    """Let ``decoder``'s layers keep the (replay-safe) caches of this module while gradient checkpointing is on."""
    layers = [m for m in decoder.modules() if isinstance(m, GradientCheckpointingLayer)]
    for layer in layers:
        layer._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for layer in layers:
            del layer._can_checkpoint_with_cache  # back to the class's False


def decoder_hidden_states(
    decoder: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, prefix: int = 0
) -> torch.Tensor:
    """The decoder's last hidden states, the rows' first ``prefix`` tokens computed once.

    ``decoder`` is a headless transformers decoder (``model.get_decoder()``, a critic's backbone). ``prefix`` is
    at most :func:`shared_prefix_length`; 0 is the plain forward (one decoder pass instead of two).

    Args:
        input_ids, attention_mask: ``[N, L]``.
    Returns:
        ``hidden [N, L, d]``: positions ``< prefix`` are the prefix's (the same tensor broadcast to every row),
        the rest each row's own. Equal to ``decoder(input_ids, attention_mask).last_hidden_state``.
    """
    if prefix == 0:  # use_cache=False: no generation cache (a copy of every layer's keys and values) is built
        return decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    with _cache_kept_under_checkpointing(decoder):
        record = Cache(layer_class_to_replicate=_RecordingLayer)
        head = decoder(input_ids=input_ids[:1, :prefix], past_key_values=record, use_cache=False).last_hidden_state
        shared = Cache(layers=[_SharedPrefixLayer(layer.keys, layer.values, len(input_ids)) for layer in record.layers])
        rest = decoder(input_ids=input_ids[:, prefix:], attention_mask=attention_mask, past_key_values=shared,
                       use_cache=False)  # the layers read a cache given to them whatever use_cache says
    return torch.cat([head.expand(len(input_ids), -1, -1), rest.last_hidden_state], dim=1)
