"""Per-token log-probs, entropies and values of the agent's response tokens.

The output layer is applied only at response positions (prompts are long, responses short), so the
``[T, V]`` logits exist only for the ``T`` generated tokens of a micro-batch, never for ``N * L``.
"""

from __future__ import annotations

import torch

from lightning_epo.algos.entropy import token_logprobs_and_entropy
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
    sharing: Sharing = Sharing(),
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of each generated token (Eq. 3's ratio input) and the policy entropy at that position (Eq. 4's H).

    ``logits[p-1]`` scores token ``p`` (causal shift); logits are divided by the sampling ``temperature``
    (so log-probs match the distribution the engine sampled from).

    ``chunk_size`` (``model.logits_chunk_size``): the rows of ``[V]`` logits worked on at once in the log-prob/entropy
    function (its float32 temporaries; the ``[T, V]`` logits themselves exist whole).

    ``sharing`` (``model.shared_prefix``, ``model.fold_turns``): the decoder computes the tokens the rows share once
    (lightning_epo/models/shared_prefix.py); the hidden states at real positions, and so everything returned, are the
    same.

    Args:
        input_ids, attention_mask, response_mask: ``[N, L]``.
    Returns:
        ``logprob [N, L]`` and ``entropy [N, L]`` (float32, 0 off the response mask).
    """
    hidden = decoder_hidden_states(actor.get_decoder(), input_ids, attention_mask, sharing)  # [N, L, d]
    rows, cols = response_positions(response_mask)
    logits = actor.get_output_embeddings()(hidden[rows, cols - 1])  # [T, V]
    if temperature != 1.0:  # skip a [T, V] copy (and its backward) in the common case
        logits = logits / temperature
    logprob, entropy = token_logprobs_and_entropy(logits, input_ids[rows, cols], chunk_size)
    return scatter_tokens(logprob, rows, cols, input_ids.shape), scatter_tokens(entropy, rows, cols, input_ids.shape)
