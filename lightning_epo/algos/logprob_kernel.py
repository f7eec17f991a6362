"""The custom autograd kernel behind :func:`lightning_epo.algos.entropy.token_logprobs_and_entropy`: a token's
log-probability (Eq. 3's ratio input) and entropy (Eq. 4) from one float32 log-softmax per chunk of rows, and their
gradient written chunk by chunk into one preallocated tensor (benchmarks/RESULTS.md, section 2)."""

from __future__ import annotations

import torch


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


class LogprobEntropy(torch.autograd.Function):
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
