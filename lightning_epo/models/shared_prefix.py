"""Tokens a micro-batch's rows share, computed once (``model.shared_prefix``, ``model.fold_turns``).

Every row of an RL step starts with the same system prompt and instructions, and the rows of one group with the
same task: in gridworld_learn's batches the prefix all rows of a micro-batch share is 61-66 of their ~230 tokens.
:func:`decoder_hidden_states` runs the decoder on that prefix once (batch 1), then on each row's remainder with
the prefix's keys and values as a read-only cache expanded to the rows; gradients flow back into the prefix
through the cached keys and values (and the prefix's hidden states, which are broadcast back to every row).

A turn's row whose prompt carries the episode's history begins every later turn's row of the episode, token for
token, and causal attention gives a sequence the hidden states of any longer sequence it begins; so with
hosts (:func:`prefix_hosts`) only the rows that begin no other are run, and each row reads its
hidden states from its host's (a gather, whose backward adds the rows' gradients into the host's).

The result equals the plain forward's at every real position (test: ``tests/models/test_shared_prefix.py``), so
everything downstream (output layer, value head, loss) is unchanged; only the decoder computes fewer tokens.

transformers drops a cache under gradient checkpointing (a layer that writes its cache would write it again on
the backward's replay). Both caches here are replay-safe (the prefix pass's records by assignment, the rows'
pass only reads), so while they run the decoder layers are told they may keep them
(``GradientCheckpointingLayer._can_checkpoint_with_cache``, transformers' switch for such caches).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
from transformers.cache_utils import Cache, DynamicLayer
from transformers.modeling_layers import GradientCheckpointingLayer


@dataclass(frozen=True)
class Sharing:
    """What a micro-batch's decoder pass computes once.

    ``prefix``: the leading tokens every computed row shares (:func:`shared_prefix_length` of those rows; 0: none).
    ``computed``: ``[H]`` or None (all rows), the rows the decoder runs on; ``source``: ``[N]``, for each row the
    position in ``computed`` of the row its hidden states are read from (:meth:`from_hosts`)."""

    prefix: int = 0
    computed: torch.Tensor | None = None
    source: torch.Tensor | None = None

    def decoder_positions(self, rows: int, length: int) -> int:
        """The positions a decoder pass computes for ``rows`` rows of ``length`` columns (padding included: it is
        computed): the prefix once, then each computed row's remainder (:func:`decoder_hidden_states`)."""
        computed = rows if self.computed is None else len(self.computed)
        return self.prefix + computed * (length - self.prefix)

    @classmethod
    def from_hosts(cls, hosts: torch.Tensor, prefix: int = 0) -> "Sharing":
        """Only the rows of ``hosts [N]`` (:func:`prefix_hosts`) computed, each row read from its host."""
        computed, source = hosts.unique(return_inverse=True)
        return cls(prefix, computed, source)


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


def prefix_hosts(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """For each row of ``input_ids [N, L]``, the row whose forward gives its hidden states: the longest row that its
    real tokens (``attention_mask`` 1, right-padded) begin; itself if none does (of identical rows, one). With causal
    attention a sequence's hidden states are those of any longer sequence it begins, so the host's forward serves
    both: an earlier turn of an episode whose prompts carry the history begins each later turn's row.

    Sorted lexicographically, a row that begins other rows begins the row right after it, so hosts chain from the
    end (``O(N log N)`` comparisons). Returns ``hosts [N]`` (long, row indices; every host is its own host)."""
    lengths = attention_mask.sum(-1).tolist()
    tokens = [tuple(ids[:length]) for ids, length in zip(input_ids.tolist(), lengths)]
    order = sorted(range(len(tokens)), key=tokens.__getitem__)
    host = list(range(len(tokens)))
    for shorter, longer in zip(reversed(order[:-1]), reversed(order[1:])):
        if tokens[longer][: len(tokens[shorter])] == tokens[shorter]:
            host[shorter] = host[longer]
    return torch.tensor(host, dtype=torch.long, device=input_ids.device)


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
    decoder: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, sharing: Sharing = Sharing()
) -> torch.Tensor:
    """The decoder's last hidden states, the rows' shared tokens computed once (:class:`Sharing`).

    ``decoder`` is a headless transformers decoder (``model.get_decoder()``, a critic's backbone). With no sharing
    this is the plain forward (one decoder pass; a prefix adds a second, on one row).

    Args:
        input_ids, attention_mask: ``[N, L]``.
    Returns:
        ``hidden [N, L, d]``, equal to ``decoder(input_ids, attention_mask).last_hidden_state`` at every real
        position. Positions ``< prefix`` are the prefix's (one tensor broadcast to every row); a row read from its
        host holds the host's states past its own end, where the plain forward holds padding's.
    """
    if sharing.computed is None:
        return _computed_hidden_states(decoder, input_ids, attention_mask, sharing.prefix)
    computed = sharing.computed
    hidden = _computed_hidden_states(decoder, input_ids[computed], attention_mask[computed], sharing.prefix)
    # [N, L, d]: the longest row is a host, so L is the rows' length. index_select, not hidden[source]: on a CPU the
    # indexing's backward adds a host's rows with atomic float adds across threads, in an order that changes from run
    # to run (two identical runs parted at RL step 1); index_select's backward adds them one index after the other
    return hidden.index_select(0, sharing.source)


def _computed_hidden_states(
    decoder: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, prefix: int
) -> torch.Tensor:
    """``hidden [N, L, d]`` of ``input_ids [N, L]``, the first ``prefix`` tokens (all rows' alike) computed once."""
    if prefix == 0:  # use_cache=False: no generation cache (a copy of every layer's keys and values) is built
        return decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    with _cache_kept_under_checkpointing(decoder):
        record = Cache(layer_class_to_replicate=_RecordingLayer)
        head = decoder(input_ids=input_ids[:1, :prefix], past_key_values=record, use_cache=False).last_hidden_state
        shared = Cache(layers=[_SharedPrefixLayer(layer.keys, layer.values, len(input_ids)) for layer in record.layers])
        rest = decoder(input_ids=input_ids[:, prefix:], attention_mask=attention_mask, past_key_values=shared,
                       use_cache=False)  # the layers read a cache given to them whatever use_cache says
    return torch.cat([head.expand(len(input_ids), -1, -1), rest.last_hidden_state], dim=1)
