import pytest
import torch

from lightning_epo.algos import KL_ESTIMATORS, POLICY_LOSSES, approx_kl, clipped_value_loss


def test_clipped_surrogate_matches_eq3():
    clip = POLICY_LOSSES.get("clipped")
    old = torch.zeros(4)
    logp = torch.log(torch.tensor([1.5, 1.5, 0.5, 0.5]))
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    loss, clipped = clip(logp, old, adv, 0.2, 0.2)
    # -min(rA, clip(r)A)
    assert torch.allclose(loss, torch.tensor([-1.2, 1.5, -0.5, 0.8]))
    assert clipped.tolist() == [True, False, False, True]


def test_clipped_surrogate_has_no_gradient_where_clipped():
    clip = POLICY_LOSSES.get("clipped")
    logp = torch.log(torch.tensor([1.5, 1.0])).requires_grad_()
    loss, _ = clip(logp, torch.zeros(2), torch.tensor([1.0, 1.0]))
    (g,) = torch.autograd.grad(loss.sum(), logp)
    assert g[0] == 0 and g[1] == pytest.approx(-1.0)  # clipped: no gradient path at all, an exact 0


def test_dual_clip_bounds_negative_advantage_loss():
    clip = POLICY_LOSSES.get("clipped")
    logp = torch.log(torch.tensor([10.0]))
    loss, _ = clip(logp, torch.zeros(1), torch.tensor([-1.0]), dual_clip=3.0)
    assert loss.item() == pytest.approx(3.0)
    loss_plain, _ = clip(logp, torch.zeros(1), torch.tensor([-1.0]))
    assert loss_plain.item() == pytest.approx(10.0)


def test_clipped_value_loss():
    v, v_old, ret = torch.tensor([2.0, 0.1]), torch.tensor([0.0, 0.0]), torch.tensor([0.0, 1.0])
    out = clipped_value_loss(v, v_old, ret, clip=0.2)
    assert torch.allclose(out, torch.tensor([0.5 * 4.0, 0.5 * 0.9**2 if 0.9**2 > 0.8**2 else 0.5 * 0.8**2]))
    assert torch.allclose(clipped_value_loss(v, v_old, ret, clip=None), 0.5 * (v - ret) ** 2)


def test_kl_estimators():
    lp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    assert torch.allclose(KL_ESTIMATORS.get("k2")(lp, ref), 0.5 * (lp - ref) ** 2)
    k3 = KL_ESTIMATORS.get("k3")(lp, ref)
    assert (k3 >= 0).all() and torch.allclose(k3, torch.exp(ref - lp) - (ref - lp) - 1)
    assert KL_ESTIMATORS.get("k3")(lp, lp).abs().max() == 0  # exp(0) - 0 - 1 and lp - lp: exactly 0 on any CPU
    assert approx_kl(lp, lp).abs().max() == 0


def test_nll_policy_loss_is_negative_log_likelihood_whatever_the_advantage():
    nll = POLICY_LOSSES.get("nll")
    logp = torch.tensor([-0.5, -2.0], requires_grad=True)
    loss, clipped = nll(logp, torch.zeros(2), torch.tensor([5.0, -5.0]))
    assert torch.equal(loss, torch.tensor([0.5, 2.0])) and not clipped.any()  # a negation: exact
    (g,) = torch.autograd.grad(loss.sum(), logp)
    assert torch.equal(g, torch.tensor([-1.0, -1.0]))


def test_k3_is_clamped_like_verls_low_var_kl():
    """d = log pi_ref - log pi is clamped to [-20, 20] before exp and the estimate to [-10, 10]: finite (with a
    finite gradient) where pi has all but left a token the reference favours; unchanged in the normal range."""
    k3 = KL_ESTIMATORS.get("k3")
    lp = torch.tensor([-95.0, 0.0], requires_grad=True)
    kl = k3(lp, torch.tensor([0.0, -95.0]))
    assert torch.equal(kl.detach(), torch.tensor([10.0, 10.0]))  # the clamp's bound itself: exact
    (g,) = torch.autograd.grad(kl.sum(), lp)
    assert torch.isfinite(g).all()
    torch.manual_seed(0)
    lp, ref = -2 * torch.rand(1000), -2 * torch.rand(1000)  # d in [-2, 2]: the estimate stays below 10
    d = ref - lp
    assert torch.allclose(k3(lp, ref), torch.exp(d) - d - 1)


def test_k2_loss_on_policy_samples_has_the_gradient_of_the_exact_kl():
    """For a categorical pi_theta, E_{a ~ pi}[grad k2(a)] = grad KL(pi || pi_ref): the expectation taken exactly
    (sum over actions, sampling weights held fixed as samples are). k1's is zero, the reason it is not offered."""
    torch.manual_seed(0)
    logits, ref = torch.randn(6, requires_grad=True), torch.log_softmax(torch.randn(6), -1)
    logp = torch.log_softmax(logits, -1)
    exact = (logp.exp() * (logp - ref)).sum()
    (g_exact,) = torch.autograd.grad(exact, logits, retain_graph=True)
    on_policy = (logp.exp().detach() * KL_ESTIMATORS.get("k2")(logp, ref)).sum()
    (g_k2,) = torch.autograd.grad(on_policy, logits, retain_graph=True)
    assert g_exact.norm() > 0.1 and torch.allclose(g_k2, g_exact, atol=1e-6)
    (g_k1,) = torch.autograd.grad((logp.exp().detach() * (logp - ref)).sum(), logits)
    assert g_k1.norm() < 1e-6
