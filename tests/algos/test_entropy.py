import math

import pytest
import torch

from lightning_epo.algos import entropy_penalty, out_of_range, token_entropy, token_logprobs
from lightning_epo.algos.entropy import PENALTIES


def reference_entropy(logits):
    return torch.distributions.Categorical(logits=logits.float()).entropy()


@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
def test_chunked_entropy_equals_unchunked_values_and_gradients(chunk):
    torch.manual_seed(0)
    logits = (torch.randn(4, 5, 33) * 3).requires_grad_()
    weights = torch.randn(4, 5)
    full = token_entropy(logits)
    chunked = token_entropy(logits, chunk_size=chunk)
    (g_full,) = torch.autograd.grad((full * weights).sum(), logits)
    (g_chunk,) = torch.autograd.grad((chunked * weights).sum(), logits)
    # chunks are other batch shapes, whose reductions may round apart by a few float32 ulp (2.4e-7 at H ~ log 33);
    # a wrong chunk boundary moves H by O(1)
    torch.testing.assert_close(chunked, full, rtol=1e-6, atol=1e-7)
    assert torch.allclose(g_full, g_chunk, atol=1e-7)
    # and both agree with autograd through the textbook formula
    (g_ref,) = torch.autograd.grad((reference_entropy(logits) * weights).sum(), logits)
    assert torch.allclose(full, reference_entropy(logits), atol=1e-5)
    assert torch.allclose(g_full, g_ref, atol=1e-5)


def test_entropy_of_uniform_and_peaked():
    logits = torch.zeros(2, 10)
    logits[1, 3] = 1e4
    h = token_entropy(logits)
    assert h[0].item() == pytest.approx(math.log(10), rel=1e-6)
    assert h[1].item() == pytest.approx(0.0, abs=1e-6)


def test_bf16_logits_give_float32_entropy_and_bf16_gradient():
    logits = torch.randn(6, 17).to(torch.bfloat16).requires_grad_()
    h = token_entropy(logits, chunk_size=4)
    assert h.dtype == torch.float32
    h.sum().backward()
    assert logits.grad.dtype == torch.bfloat16


@pytest.mark.parametrize("chunk", [None, 2])
def test_token_logprobs_match_log_softmax(chunk):
    torch.manual_seed(1)
    logits = torch.randn(3, 4, 11, requires_grad=True)
    labels = torch.randint(0, 11, (3, 4))
    lp = token_logprobs(logits, labels, chunk)
    ref = torch.log_softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1)
    assert torch.allclose(lp, ref, atol=1e-6)
    (g,) = torch.autograd.grad(lp.sum(), logits)
    (g_ref,) = torch.autograd.grad(ref.sum(), logits)
    assert torch.allclose(g, g_ref, atol=1e-6)


def test_penalty_gradient_nonzero_outside_range_and_zero_inside():
    ref, kl, kr, alpha = 1.0, 0.5, 2.0, 0.1
    h = torch.tensor([0.2, 0.5, 1.0, 1.9, 2.5, 4.0], requires_grad=True)
    p = entropy_penalty(h, ref, kl, kr, alpha)
    (g,) = torch.autograd.grad(p.sum(), h)
    assert torch.allclose(g, torch.tensor([-alpha, 0.0, 0.0, 0.0, alpha, alpha]))
    assert torch.allclose(p.detach(), torch.tensor([alpha * 0.3, 0, 0, 0, alpha * 0.5, alpha * 2.0]))
    assert out_of_range(h, ref, kl, kr).tolist() == [True, False, False, False, True, True]


def test_penalty_accepts_tensor_reference_and_never_differentiates_it():
    ref = torch.tensor(1.0, requires_grad=True)
    h = torch.tensor([3.0], requires_grad=True)
    entropy_penalty(h, ref, 0.0, 2.0, 1.0).sum().backward()
    assert ref.grad is None and h.grad.item() == 1.0  # alpha times relu's slope 1: exact


def test_indicator_penalty_is_the_reference_codes_constant_with_zero_gradient():
    h = torch.tensor([0.1, 1.0, 3.0], requires_grad=True)
    p = PENALTIES.get("indicator")(h, 1.0, 0.5, 2.0, 0.05)
    assert p.tolist() == pytest.approx([0.05, 0.0, 0.05])
    assert not p.requires_grad or torch.autograd.grad(p.sum(), h, allow_unused=True)[0] is None


def test_unknown_penalty_lists_valid_names():
    with pytest.raises(KeyError, match="hinge, indicator"):
        PENALTIES.get("square")


@pytest.mark.parametrize("chunk", [None, 1, 5])
@pytest.mark.parametrize("use", ["both", "logprob", "entropy"])
def test_fused_logprob_and_entropy_gradients_match_autograd(chunk, use):
    from lightning_epo.algos.entropy import token_logprobs_and_entropy

    torch.manual_seed(2)
    logits = (torch.randn(3, 4, 19) * 2).requires_grad_()
    labels = torch.randint(0, 19, (3, 4))
    w_lp, w_h = torch.randn(3, 4), torch.randn(3, 4)
    lp, h = token_logprobs_and_entropy(logits, labels, chunk)
    ref_logp = torch.log_softmax(logits, -1)
    ref_lp = ref_logp.gather(-1, labels[..., None]).squeeze(-1)
    ref_h = -(ref_logp.exp() * ref_logp).sum(-1)
    pick = {"both": (1, 1), "logprob": (1, 0), "entropy": (0, 1)}[use]
    ours = pick[0] * (lp * w_lp).sum() + pick[1] * (h * w_h).sum()
    ref = pick[0] * (ref_lp * w_lp).sum() + pick[1] * (ref_h * w_h).sum()
    (g,) = torch.autograd.grad(ours, logits)
    (g_ref,) = torch.autograd.grad(ref, logits)
    assert torch.allclose(lp, ref_lp, atol=1e-5) and torch.allclose(h, ref_h, atol=1e-5)
    assert torch.allclose(g, g_ref, atol=1e-5)
