"""Per-token log-probs, entropies and values of the agent's response tokens.

The output layer is applied only at response positions (prompts are long, responses short), so the
``[T, V]`` logits exist only for the ``T`` generated tokens of a micro-batch, never for ``N * L``.
"""

from __future__ import annotations

from typing import Callable

import torch

from lightning_epo.algos.entropy import fused_output_logprobs_and_entropy, token_logprobs_and_entropy
from lightning_epo.models.shared_prefix import Sharing, decoder_hidden_states


def response_positions(response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows [T], cols [T])`` of the response tokens in ``response_mask [N, L]`` (never column 0)."""
    rows, cols = response_mask.bool().nonzero(as_tuple=True)
    return rows, cols


def scatter_tokens(flat: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Put per-token values ``flat [T]`` back at ``(rows, cols)`` of a zero ``[N, L]`` tensor (differentiable)."""
    out = flat.new_zeros(shape)
    return out.index_put((rows, cols), flat)


def actor_token_outputs(
    actor: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_mask: torch.Tensor,
    chunk_size: int | None = None,
    temperature: float = 1.0,
    fused: bool = False,
    sharing: Sharing = Sharing(),
    token_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of each generated token (Eq. 3's ratio input) and the policy entropy at that position (Eq. 4's H).

    ``logits[p-1]`` scores token ``p`` (causal shift); logits are divided by the sampling ``temperature``
    (so log-probs match the distribution the engine sampled from).

    ``fused`` (``model.fused_output``) applies the output layer inside the log-prob/entropy function, ``chunk_size``
    rows at a time, so the ``[T, V]`` logits and their gradient never exist whole (memory flat in ``T``; the backward
    recomputes each chunk's logits: one more output-layer product). ``chunk_size`` (``model.logits_chunk_size``) keeps
    its meaning, the rows of ``[V]`` logits worked on at once; only with ``fused`` does it bound the logits themselves.
    A switch of its own rather than "fuse whenever a chunk size is set": the shipped Qwen configs set a chunk size
    and run under ZeRO-3, whose partitioned output weight the fused path cannot read (it refuses it), and the
    extra product is a time cost to opt into. Off by default: today's path, today's numbers.

    ``sharing`` (``model.shared_prefix``, ``model.fold_turns``): the decoder computes the tokens the rows share once
    (lightning_epo/models/shared_prefix.py); the hidden states at real positions, and so everything returned, are the
    same.

    ``token_loss(logprob, entropy)`` (``[N, L]`` each; the micro-batch's loss as far as it depends on them, a sum of
    per-token terms): with ``fused``, the fused function forms the output layer's gradients in its forward and
    the backward makes no second product when the loss differentiated is this one (ignored otherwise).

    Args:
        input_ids, attention_mask, response_mask: ``[N, L]``.
    Returns:
        ``logprob [N, L]`` and ``entropy [N, L]`` (float32, 0 off the response mask).
    """
    hidden = decoder_hidden_states(actor.get_decoder(), input_ids, attention_mask, sharing)  # [N, L, d]
    rows, cols = response_positions(response_mask)
    head, labels = actor.get_output_embeddings(), input_ids[rows, cols]
    if fused:
        if hasattr(head.weight, "ds_id"):  # DeepSpeed ZeRO-3: the weight is gathered only inside head's own forward
            raise ValueError("model.fused_output=true cannot read a ZeRO-3 partitioned output layer: set "
                             "model.fused_output=false or use trainer=deepspeed_stage_2")
        shape = input_ids.shape
        flat_loss = None if token_loss is None else (  # the loss of the [T] outputs, scattered as returned
            lambda lp, ent: token_loss(scatter_tokens(lp, rows, cols, shape), scatter_tokens(ent, rows, cols, shape)))
        logprob, entropy = fused_output_logprobs_and_entropy(
            hidden[rows, cols - 1], head.weight, labels, head.bias, temperature, chunk_size,
            flat_loss,
        )
    else:
        logits = head(hidden[rows, cols - 1])  # [T, V]
        if temperature != 1.0:  # skip a [T, V] copy (and its backward) in the common case
            logits = logits / temperature
        logprob, entropy = token_logprobs_and_entropy(logits, labels, chunk_size)
    return scatter_tokens(logprob, rows, cols, input_ids.shape), scatter_tokens(entropy, rows, cols, input_ids.shape)
