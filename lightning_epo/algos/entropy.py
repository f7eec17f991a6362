"""Token entropy and the EPO entropy-smoothing penalty (paper Eqs. 4-5)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lightning_epo.algos.registry import Registry

PENALTIES: Registry = Registry("entropy penalty")


def _fill_rows(logits: torch.Tensor, rows: slice, labels: torch.Tensor, logprob: torch.Tensor, entropy: torch.Tensor,
               lse: torch.Tensor) -> None:
    """Forward of one chunk: ``logprob``, ``entropy`` and ``lse`` (all ``[T]``) at ``rows`` from the float32
    ``logits [c, V]`` of those rows: ``log p = l - logsumexp(l)``, ``log p(label)`` (Eq. 3's ratio input) and
    ``H = -sum p log p`` (Eq. 4)."""
    lse[rows] = torch.logsumexp(logits, dim=-1)
    logp = logits - lse[rows, None]
    logprob[rows] = logp.gather(-1, labels[rows, None]).squeeze(-1)
    entropy[rows] = -logp.exp().mul_(logp).sum(-1)


def _logits_grad_(logp: torch.Tensor, rows: slice, labels: torch.Tensor, entropy: torch.Tensor,
                  g_lp: torch.Tensor | None, g_h: torch.Tensor | None) -> torch.Tensor:
    """Backward of one chunk, in place: float32 ``log p [c, V]`` of ``rows`` becomes ``dL/dl [c, V]``,
    ``g_lp * (onehot(label) - p) - g_h * p * (log p + H)`` (``g_lp``, ``g_h``: ``[T]`` or ``None``, not both)."""
    if g_h is None:
        logp.exp_().mul_(-g_lp[rows, None])  # -g_lp p
    else:
        p = logp.exp()
        shift = g_h[rows] * entropy[rows] + (g_lp[rows] if g_lp is not None else 0.0)
        logp.mul_(-g_h[rows, None]).sub_(shift[:, None]).mul_(p)  # -p (g_h (log p + H) + g_lp)
    if g_lp is not None:
        logp.scatter_add_(-1, labels[rows, None], g_lp[rows, None])
    return logp


class _LogprobEntropy(torch.autograd.Function):
    """``(log p(label), H)`` for each row of ``logits [T, V]`` from one float32 log-softmax per chunk of rows.

    Backward, chunk by chunk and in place in one preallocated gradient:
    ``dL/dl = g_lp * (onehot(label) - p) - g_h * p * (log p + H)``. An output that gets no gradient is skipped
    (plain PPO only logs ``H``: its backward then costs nothing), so at most ``chunk`` rows of float32
    temporaries exist besides the gradient itself.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.set_materialize_grads(False)
        logprob = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        entropy, lse = torch.empty_like(logprob), torch.empty_like(logprob)
        for start in range(0, logits.shape[0], chunk):
            rows = slice(start, start + chunk)
            _fill_rows(logits[rows].float(), rows, labels, logprob, entropy, lse)
        ctx.save_for_backward(logits, labels, lse, entropy)
        ctx.chunk = chunk
        return logprob, entropy

    @staticmethod
    def backward(ctx, g_lp: torch.Tensor | None, g_h: torch.Tensor | None):
        logits, labels, lse, entropy = ctx.saved_tensors
        if g_lp is None and g_h is None:
            return None, None, None
        grad = torch.empty_like(logits)
        in_place = grad.dtype == torch.float32  # write straight into the gradient, no float32 copy
        for start in range(0, logits.shape[0], ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            logp = torch.sub(logits[rows].float(), lse[rows, None], out=grad[rows] if in_place else None)
            d = _logits_grad_(logp, rows, labels, entropy, g_lp, g_h)
            if not in_place:
                grad[rows] = d
        return grad, None, None


def token_logprobs_and_entropy(
    logits: torch.Tensor, labels: torch.Tensor, chunk_size: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``log pi(label | context)`` (Eq. 3's ratio) and the entropy ``H`` (Eq. 4's ``H_jti``) of each position.

    ``logits [..., V]`` (any float dtype), ``labels [...]`` -> two float32 ``[...]`` tensors. One log-softmax
    serves both; with ``chunk_size`` no more than ``chunk_size`` rows of float32 temporaries exist at a time
    (forward and backward), and any ``chunk_size`` gives the same values and gradients.
    """
    flat, flat_labels = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
    logprob, entropy = _LogprobEntropy.apply(flat, flat_labels, chunk_size or max(flat.shape[0], 1))
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
