"""Token entropy and the EPO entropy-smoothing penalty (paper Eqs. 4-5)."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from lightning_epo.algos.registry import Registry

PENALTIES: Registry = Registry("entropy penalty")


def _fill_rows(logits: torch.Tensor, rows: slice, labels: torch.Tensor, logprob: torch.Tensor, entropy: torch.Tensor,
               lse: torch.Tensor, in_place: bool = False) -> torch.Tensor:
    """Forward of one chunk: ``logprob``, ``entropy`` and ``lse`` (all ``[T]``) at ``rows`` from the float32
    ``logits [c, V]`` of those rows: ``log p = l - logsumexp(l)``, ``log p(label)`` (Eq. 3's ratio input) and
    ``H = -sum p log p`` (Eq. 4). Returns the chunk's ``log p [c, V]``: a new tensor, or with ``in_place`` the
    logits themselves turned into it (one ``[c, V]`` temporary fewer)."""
    lse[rows] = torch.logsumexp(logits, dim=-1)
    logp = logits.sub_(lse[rows, None]) if in_place else logits - lse[rows, None]
    logprob[rows] = logp.gather(-1, labels[rows, None]).squeeze(-1)
    entropy[rows] = -logp.exp().mul_(logp).sum(-1)
    return logp


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


def _chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float):
    """Float32 ``(h W^T + b) / temperature``: ``hidden [c, d]``, ``weight [V, d]``, ``bias [V]`` -> a new ``[c, V]``."""
    logits = F.linear(hidden, weight, bias).float()
    return logits.div_(temperature) if temperature != 1.0 else logits


class _FusedOutputLogprobEntropy(torch.autograd.Function):
    """``(log p(label), H)`` per row of ``hidden [T, d]`` through the output layer ``l = (h W^T + b) / temperature``,
    one chunk of rows at a time: only one chunk's ``[chunk, V]`` logits (and float32 temporaries) ever exist.

    The forward keeps ``h``, ``W``, ``b`` and the per-row ``logsumexp`` and ``H``; the backward recomputes each chunk's
    logits, turns them into ``dL/dl`` with :func:`_logits_grad_` (the math of :class:`_LogprobEntropy`), then
    ``dL/dh = dL/dl W / temperature`` for the chunk and accumulates ``dL/dW += (dL/dl)^T h / temperature`` and
    ``dL/db += sum_rows dL/dl / temperature`` in float32.

    With ``token_loss`` (a function of ``(log p [T], H [T])`` that is a sum of per-token terms, as the EPO objective
    is: fixed weights, old log-probs, advantages and ``H̄``), the forward also forms the gradients, chunk by chunk
    while the chunk's logits exist: ``dL/d log p`` and ``dL/dH`` of the chunk's tokens come from ``token_loss``'s
    own gradient (a separable loss gives each token's from that token's values alone), as fused cross-entropy
    kernels do. The backward then returns them, with no second output-layer product, when the upstream gradients
    it receives are those ``token_loss`` gave; any other upstream gradient (another loss, a scaled one) takes the
    recomputing backward, so the result is always the gradient of the loss actually differentiated.
    """

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor,
                temperature: float, chunk: int, token_loss: Callable | None) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.set_materialize_grads(False)
        logprob = torch.zeros(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        entropy, lse = torch.zeros_like(logprob), torch.empty_like(logprob)
        form = token_loss is not None and any(ctx.needs_input_grad[:3])
        grads = g_lp = g_h = None
        for start in range(0, hidden.shape[0], chunk):
            rows = slice(start, start + chunk)
            logits = _chunk_logits(hidden[rows], weight, bias, temperature)  # a new [c, V] tensor
            logp = _fill_rows(logits, rows, labels, logprob, entropy, lse, in_place=True)
            del logits  # now logp
            if form:  # the gradients made after the chunk's forward temporaries are gone (the peak stays the backward's)
                grads = grads or _new_grads(hidden, weight, bias, ctx.needs_input_grad[:3])
                chunk_lp, chunk_h = _token_loss_grads(token_loss, logprob, entropy)
                g_lp = _put_rows(g_lp, chunk_lp, rows)
                g_h = _put_rows(g_h, chunk_h, rows)
                if g_lp is not None or g_h is not None:  # a loss of neither output: zero gradients
                    _add_chunk_grads_(logp, rows, labels, entropy, g_lp, g_h, hidden, weight, temperature, grads)
            del logp  # free this chunk's [c, V] before the next chunk's logits are made
        ctx.save_for_backward(hidden, weight, bias, labels, lse, entropy)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.formed = None if grads is None else (g_lp, g_h, grads)
        return logprob, entropy

    @staticmethod
    def backward(ctx, g_lp: torch.Tensor | None, g_h: torch.Tensor | None):
        hidden, weight, bias, labels, lse, entropy = ctx.saved_tensors
        if g_lp is None and g_h is None:
            return None, None, None, None, None, None, None
        formed, ctx.formed = ctx.formed, None
        if formed is not None and _same(g_lp, formed[0]) and _same(g_h, formed[1]):
            grads = formed[2]
        else:
            grads = _new_grads(hidden, weight, bias, ctx.needs_input_grad[:3])
            for start in range(0, hidden.shape[0], ctx.chunk):
                rows = slice(start, start + ctx.chunk)
                logp = _chunk_logits(hidden[rows], weight, bias, ctx.temperature).sub_(lse[rows, None])
                _add_chunk_grads_(logp, rows, labels, entropy, g_lp, g_h, hidden, weight, ctx.temperature, grads)
                del logp
        grad_h, grad_w, grad_b = grads
        grad_w = grad_w.to(weight.dtype) if grad_w is not None else None
        grad_b = grad_b.to(bias.dtype) if grad_b is not None else None
        return grad_h, grad_w, grad_b, None, None, None, None


def _new_grads(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, wanted: tuple[bool, ...]):
    """Empty ``dL/dh [T, d]`` and zero float32 ``dL/dW [V, d]``, ``dL/db [V]`` (None where no gradient is wanted)."""
    want_h, want_w, want_b = wanted
    return [
        torch.empty_like(hidden) if want_h else None,
        torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_w else None,
        torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if want_b else None,
    ]


def _add_chunk_grads_(logp: torch.Tensor, rows: slice, labels: torch.Tensor, entropy: torch.Tensor,
                      g_lp: torch.Tensor | None, g_h: torch.Tensor | None, hidden: torch.Tensor, weight: torch.Tensor,
                      temperature: float, grads: list) -> None:
    """One chunk's share of the gradients: float32 ``log p [c, V]`` of ``rows`` becomes ``dL/dl`` (in place,
    :func:`_logits_grad_`), then ``grads = [dL/dh, dL/dW, dL/db]`` get the chunk's rows / sums."""
    grad_h, grad_w, grad_b = grads
    d = _logits_grad_(logp, rows, labels, entropy, g_lp, g_h)  # dL/dl [c, V] float32
    if temperature != 1.0:
        d.div_(temperature)  # dL/d(h W^T + b)
    if grad_b is not None:
        grad_b += d.sum(0)
    d = d.to(weight.dtype)  # the output layer's own dtype for its two products (as the unfused backward)
    if grad_h is not None:
        grad_h[rows] = d @ weight
    if grad_w is not None and d.dtype == torch.float32:
        grad_w.addmm_(d.T, hidden[rows])
    elif grad_w is not None:  # a bf16 [V, d] product (float32 inside the matmul), summed over chunks in float32
        grad_w += d.T @ hidden[rows]


def _token_loss_grads(token_loss: Callable, logprob: torch.Tensor, entropy: torch.Tensor):
    """``(dL/d log p, dL/dH)`` (each ``[T]``, or None where ``token_loss`` does not depend on it) at the current
    values; rows not computed yet hold 0 and only the caller's rows are read."""
    with torch.enable_grad():
        lp, h = logprob.detach().requires_grad_(), entropy.detach().requires_grad_()
        loss = token_loss(lp, h)
        return torch.autograd.grad(loss, (lp, h), allow_unused=True) if loss.requires_grad else (None, None)


def _put_rows(into: torch.Tensor | None, grad: torch.Tensor | None, rows: slice) -> torch.Tensor | None:
    """``into`` (``[T]``, made at the first chunk) with ``grad``'s ``rows``; None while the loss ignores the output."""
    if grad is None:
        return into
    into = torch.zeros_like(grad) if into is None else into
    into[rows] = grad[rows]
    return into


def _same(received: torch.Tensor | None, formed: torch.Tensor | None) -> bool:
    """Whether the backward received exactly the upstream gradient the forward formed its gradients with."""
    if received is None or formed is None:
        return received is None and formed is None
    return torch.equal(received, formed)


def fused_output_logprobs_and_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, bias: torch.Tensor | None = None,
    temperature: float = 1.0, chunk_size: int | None = None, token_loss: Callable | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`token_logprobs_and_entropy` of the logits ``(h W^T + b) / temperature`` without ever holding them whole:
    ``log pi(label | context)`` (Eq. 3's ratio) and ``H`` (Eq. 4's ``H_jti``) per position.

    ``hidden [..., d]``, ``weight [V, d]`` (the output layer's, tied to the input embedding or not: autograd adds
    the two gradients of a tied weight), ``bias [V]`` or ``None``, ``labels [...]`` -> two float32 ``[...]`` tensors.
    At most ``chunk_size`` rows (all rows if ``None``) of ``[V]`` logits exist at a time, forward and backward (which
    recomputes them: one more ``[chunk, d] x [d, V]`` product per chunk). Low-precision (bf16) inputs: the products
    run in their dtype, the softmax math and the gradients of ``weight`` and ``bias`` (summed over chunks) in float32.

    ``token_loss(logprob, entropy)`` (the two outputs, shaped as ``labels``; a sum of per-token terms): the loss that
    will be differentiated, so that the forward forms the gradients and the backward makes no second product
    (:class:`_FusedOutputLogprobEntropy`); values and gradients are the same.
    """
    flat, flat_labels = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1)
    chunk = chunk_size or max(flat.shape[0], 1)
    flat_loss = None if token_loss is None else (lambda lp, h: token_loss(lp.reshape(labels.shape), h.reshape(labels.shape)))
    logprob, entropy = _FusedOutputLogprobEntropy.apply(flat, weight, bias, flat_labels, float(temperature), chunk,
                                                        flat_loss)
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
