"""The fused output layer + log-prob + entropy: same values and gradients as the output layer followed by
``token_logprobs_and_entropy``, for tied and untied heads, with no whole ``[T, V]`` tensor kept for the backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lightning_epo.algos.entropy import fused_output_logprobs_and_entropy, token_logprobs_and_entropy

T, D, V = 13, 8, 37


def make(tied: bool, bias: bool, dtype=torch.float32):
    """Embedding ``E [V, d]``, a layer ``A [d, d]`` making hidden states ``h = tanh(E[ids] A)``, the output weight
    (``E`` itself when tied), the bias, token ids and labels; and weights for the two outputs."""
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(V, D, generator=g).to(dtype).requires_grad_()
    layer = (torch.randn(D, D, generator=g) / D**0.5).to(dtype).requires_grad_()
    head = emb if tied else torch.randn(V, D, generator=g).to(dtype).requires_grad_()
    b = (torch.randn(V, generator=g).to(dtype).requires_grad_()) if bias else None
    ids, labels = torch.randint(0, V, (T,), generator=g), torch.randint(0, V, (T,), generator=g)
    w_lp, w_h = torch.randn(T, generator=g), torch.randn(T, generator=g)
    params = [p for p in (emb, layer, head, b) if p is not None]
    return dict(emb=emb, layer=layer, head=head, bias=b, ids=ids, labels=labels, w=(w_lp, w_h),
                params=list({id(p): p for p in params}.values()))


def outputs(m, fused: bool, temperature: float, chunk: int | None, cast=None, formed: bool = False):
    """``(log p, H)`` and the gradients of ``sum(w_lp log p) + sum(w_h H)`` w.r.t. every parameter (and ``h``);
    ``formed``: the fused function is given that loss (``token_loss``) and forms the gradients in its forward."""
    params = [p if cast is None else p.detach().to(cast).requires_grad_() for p in m["params"]]
    by_id = {id(p): q for p, q in zip(m["params"], params)}
    emb, layer, head = by_id[id(m["emb"])], by_id[id(m["layer"])], by_id[id(m["head"])]
    b = by_id[id(m["bias"])] if m["bias"] is not None else None
    h = torch.tanh(emb[m["ids"]] @ layer)
    h.retain_grad()
    def token_loss(lp, ent):
        return (lp * m["w"][0]).sum() + (ent * m["w"][1]).sum()

    if fused:
        lp, ent = fused_output_logprobs_and_entropy(h, head, m["labels"], b, temperature, chunk,
                                                    token_loss if formed else None)
    else:
        lp, ent = token_logprobs_and_entropy(F.linear(h, head, b) / temperature, m["labels"], chunk)
    loss = token_loss(lp, ent)
    grads = torch.autograd.grad(loss, [h, *params])
    return lp.detach(), ent.detach(), [g.float() for g in grads]


def close(a, b, rel):
    """Within ``rel`` of the reference's largest magnitude."""
    return torch.allclose(a.float(), b.float(), rtol=0, atol=rel * b.float().abs().max().item())


@pytest.mark.parametrize("formed", [False, True], ids=["recomputed", "formed"])
@pytest.mark.parametrize("chunk", [1, 4, 5, 13, 64, None])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("tied, bias", [(False, False), (True, False), (False, True), (True, True)])
def test_fused_equals_output_layer_then_logprob_entropy(tied, bias, temperature, chunk, formed):
    m = make(tied, bias)
    ref = outputs(m, fused=False, temperature=temperature, chunk=None)
    ours = outputs(m, fused=True, temperature=temperature, chunk=chunk, formed=formed)
    assert close(ours[0], ref[0], 1e-5) and close(ours[1], ref[1], 1e-5)
    for g, g_ref in zip(ours[2], ref[2]):  # h, embedding (+ head when tied), layer, head, bias
        assert close(g, g_ref, 1e-5)


def count_products(monkeypatch) -> list[int]:
    """Record the rows of every output-layer product the fused function makes."""
    import lightning_epo.algos.entropy as entropy_lib

    rows, product = [], entropy_lib._chunk_logits
    monkeypatch.setattr(entropy_lib, "_chunk_logits", lambda h, *a: rows.append(len(h)) or product(h, *a))
    return rows


@pytest.mark.parametrize("formed", [False, True])
def test_gradients_formed_in_the_forward_need_no_second_product(monkeypatch, formed):
    products = count_products(monkeypatch)
    outputs(make(tied=False, bias=True), fused=True, temperature=0.7, chunk=4, formed=formed)
    assert products == [4, 4, 4, 1] * (1 if formed else 2)


@pytest.mark.parametrize("entropy_weight", [1.0, 0.0])
def test_another_upstream_gradient_is_recomputed(monkeypatch, entropy_weight):
    """The loss differentiated is not ``token_loss`` (here: other weights, or log-probs only): the gradients
    formed in the forward would be wrong, so the backward recomputes and gives the real loss's."""
    m = make(tied=True, bias=False)
    ref = outputs(m, fused=False, temperature=1.0, chunk=None)
    products = count_products(monkeypatch)
    h = torch.tanh(m["emb"][m["ids"]] @ m["layer"])
    lp, ent = fused_output_logprobs_and_entropy(h, m["head"], m["labels"], None, 1.0, 5,
                                                token_loss=lambda lp, ent: 2 * lp.sum() + entropy_weight * ent.sum())
    grads = torch.autograd.grad((lp * m["w"][0]).sum() + (ent * m["w"][1]).sum(), [h, *m["params"]])
    assert len(products) == 6  # three chunks forward, three again in the backward
    for g, g_ref in zip(grads, ref[2]):
        assert close(g, g_ref, 1e-5)


def test_a_token_loss_of_neither_output_forms_zero_gradients():
    """A loss that does not depend on the outputs (a constant): nothing to form, and no error."""
    h = torch.randn(T, D, requires_grad=True)
    w = torch.randn(V, D, requires_grad=True)
    lp, ent = fused_output_logprobs_and_entropy(h, w, torch.randint(0, V, (T,)), chunk_size=4,
                                                token_loss=lambda lp, ent: torch.zeros(()))
    g_h, g_w = torch.autograd.grad((lp * 0).sum(), (h, w))
    assert not g_h.any() and not g_w.any()


def test_tied_weight_gets_both_gradients():
    """A tied weight's gradient is the embedding's plus the output layer's: neither alone matches."""
    m = make(tied=True, bias=False)
    g_tied = outputs(m, fused=True, temperature=1.0, chunk=4)[2][1]
    untied = dict(m, head=m["head"].detach().clone().requires_grad_())
    untied["params"] = [untied["emb"], untied["layer"], untied["head"]]
    _, _, (_, g_emb, _, g_head) = outputs(untied, fused=True, temperature=1.0, chunk=4)
    assert close(g_tied, g_emb + g_head, 1e-6)
    assert not close(g_tied, g_emb, 1e-2) and not close(g_tied, g_head, 1e-2)


@pytest.mark.parametrize("use", ["logprob", "entropy"])
def test_one_output_without_gradient(use):
    m = make(tied=False, bias=True)
    m["w"] = (m["w"][0] * (use == "logprob"), m["w"][1] * (use == "entropy"))
    ref, ours = outputs(m, False, 0.7, None), outputs(m, True, 0.7, 3)
    for g, g_ref in zip(ours[2], ref[2]):
        assert close(g, g_ref, 1e-5)
    h = torch.randn(T, D, requires_grad=True)
    lp, ent = fused_output_logprobs_and_entropy(h, m["head"], m["labels"], m["bias"], 0.7, 3)
    (g,) = torch.autograd.grad((lp if use == "logprob" else ent).sum(), h)  # the other output is not in the graph
    assert torch.isfinite(g).all()


@pytest.mark.parametrize("tied", [False, True])
def test_bf16_inputs_close_to_float32_reference(tied):
    m = make(tied, bias=True)
    ref = outputs(m, fused=False, temperature=0.7, chunk=None)
    ours = outputs(m, fused=True, temperature=0.7, chunk=5, cast=torch.bfloat16)
    assert ours[0].dtype == torch.float32 and ours[1].dtype == torch.float32
    assert close(ours[0], ref[0], 1e-2) and close(ours[1], ref[1], 1e-2)
    for g, g_ref in zip(ours[2], ref[2]):
        assert close(g, g_ref, 4e-2)


def test_bf16_parameters_get_bf16_gradients():
    h = torch.randn(T, D, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(V, D, dtype=torch.bfloat16, requires_grad=True)
    b = torch.zeros(V, dtype=torch.bfloat16, requires_grad=True)
    lp, ent = fused_output_logprobs_and_entropy(h, w, torch.randint(0, V, (T,)), b, chunk_size=4)
    (lp.sum() + ent.sum()).backward()
    assert h.grad.dtype == w.grad.dtype == b.grad.dtype == torch.bfloat16


@pytest.mark.parametrize("fused, whole", [(True, False), (False, True)])
def test_no_whole_logits_are_kept_for_the_backward(fused, whole):
    """What autograd saves: the fused path keeps only ``[T, d]``, ``[V, d]`` and ``[T]`` tensors; the unfused
    path keeps the ``[T, V]`` logits (the check can tell them apart)."""
    m = make(tied=False, bias=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        outputs(m, fused=fused, temperature=0.7, chunk=4)
    assert any(s == (T, V) for s in saved) == whole
