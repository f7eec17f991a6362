"""Token entropy and the EPO entropy-smoothing penalty (paper Eqs. 4-5)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lightning_epo.algos.logprob_kernel import LogprobEntropy
from lightning_epo.algos.registry import Registry

PENALTIES: Registry = Registry("entropy penalty")


def token_logprobs_and_entropy(
    logits: torch.Tensor, labels: torch.Tensor, chunk_size: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``log pi(label | context)`` (Eq. 3's ratio) and the entropy ``H`` (Eq. 4's ``H_jti``) of each position.

    ``logits [..., V]`` (any float dtype), ``labels [...]`` -> two float32 ``[...]`` tensors. One log-softmax
    serves both; with ``chunk_size`` no more than ``chunk_size`` rows of float32 temporaries exist at a time
    (forward and backward), and any ``chunk_size`` gives the same values and gradients.
    """
    flat, flat_labels = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
    logprob, entropy = LogprobEntropy.apply(flat, flat_labels, chunk_size or max(flat.shape[0], 1))
    return logprob.reshape(labels.shape), entropy.reshape(labels.shape)


def token_entropy(logits: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """Per-token entropy over the vocabulary, Eq. 4's ``H_jti``: ``logits [..., V] -> H [...]`` (float32).

    ``chunk_size`` bounds the float32 probabilities held at once (rows of ``[V]``), with the same values and
    gradients as ``None`` (all rows at once).
    """
    labels = torch.zeros(logits.shape[:-1], dtype=torch.long, device=logits.device)
    return token_logprobs_and_entropy(logits, labels, chunk_size)[1]


def token_logprobs(logits: torch.Tensor, labels: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """``log pi(label | context)`` per token: ``logits [..., V]``, ``labels [...]`` -> ``[...]`` float32."""
    return token_logprobs_and_entropy(logits, labels, chunk_size)[0]


@PENALTIES.register("hinge")
def entropy_penalty(
    entropy: torch.Tensor, ref_entropy: float | torch.Tensor, kappa_l: float, kappa_r: float, alpha: float
) -> torch.Tensor:
    """Eq. 5, elementwise and differentiable in ``H``:
    ``P = alpha * (relu(kappa_l * Hbar - H) + relu(H - kappa_r * Hbar))``.

    Args:
        entropy: ``H[...]`` token entropies (with grad).
        ref_entropy: ``Hbar``, the history-window mean (Python float or 0-d tensor, no grad).
    Returns:
        ``P[...]``: zero (and zero gradient) inside ``[kappa_l*Hbar, kappa_r*Hbar]``, slope ``-alpha`` below
        and ``+alpha`` above.
    """
    ref = torch.as_tensor(ref_entropy, dtype=entropy.dtype, device=entropy.device).detach()
    return alpha * (F.relu(kappa_l * ref - entropy) + F.relu(entropy - kappa_r * ref))


@PENALTIES.register("indicator")
def entropy_penalty_indicator(
    entropy: torch.Tensor, ref_entropy: float | torch.Tensor, kappa_l: float, kappa_r: float, alpha: float
) -> torch.Tensor:
    """The released reference code's Eq. 5: ``alpha * 1[H outside [kappa_l*Hbar, kappa_r*Hbar]]``.

    A constant per token, so its gradient is zero: L_smooth then only shifts the logged loss.
    Offered as the explicit, non-default ``algo.epo.penalty=indicator`` for reproducing that code.
    Shapes as :func:`entropy_penalty`.
    """
    return alpha * out_of_range(entropy.detach(), ref_entropy, kappa_l, kappa_r).to(entropy.dtype)


def out_of_range(
    entropy: torch.Tensor, ref_entropy: float | torch.Tensor, kappa_l: float, kappa_r: float
) -> torch.Tensor:
    """Bool ``[...]``: tokens whose entropy lies outside ``[kappa_l*Hbar, kappa_r*Hbar]`` (Eq. 5's range)."""
    ref = torch.as_tensor(ref_entropy, dtype=entropy.dtype, device=entropy.device)
    return (entropy < kappa_l * ref) | (entropy > kappa_r * ref)
