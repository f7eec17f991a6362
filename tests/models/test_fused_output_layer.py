"""``model.fused_output``: ``actor_token_outputs`` on the tiny model gives the same log-probs, entropies and
parameter gradients with the output layer fused into the log-prob/entropy function as without."""

from __future__ import annotations

import pytest
import torch

from lightning_epo.models.loading import load_actor
from lightning_epo.models.policy_outputs import actor_token_outputs
from tests.models.conftest import L, N


@pytest.fixture
def actor(tiny_model_path):
    return load_actor({"name_or_path": tiny_model_path, "dtype": "float32", "attn_implementation": "sdpa"})


@pytest.fixture
def batch(padded_ids):
    input_ids, attention_mask = padded_ids
    response_mask = torch.zeros(N, L, dtype=torch.long)
    response_mask[0, 5:], response_mask[1, 8:11], response_mask[2, 2:9] = 1, 1, 1  # T = 17 tokens
    return input_ids, attention_mask, response_mask


def run(actor, batch, **kwargs):
    """Log-probs, entropies and every parameter's gradient of a loss using both."""
    actor.zero_grad(set_to_none=True)
    logprob, entropy = actor_token_outputs(actor, *batch, **kwargs)
    weights = torch.randn(N, L, generator=torch.Generator().manual_seed(1))
    ((logprob * weights).sum() + (entropy * weights.flip(0)).sum()).backward()
    return logprob.detach(), entropy.detach(), {n: p.grad.clone() for n, p in actor.named_parameters()}


def assert_same(a, b):
    assert torch.allclose(a[0], b[0], rtol=1e-5, atol=1e-6) and torch.allclose(a[1], b[1], rtol=1e-5, atol=1e-6)
    assert a[2].keys() == b[2].keys()
    for name in a[2]:
        scale = b[2][name].abs().max().item()
        assert torch.allclose(a[2][name], b[2][name], rtol=0, atol=1e-5 * scale), name


@pytest.mark.parametrize("chunk", [None, 4, 17])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_fused_switch_changes_nothing_on_the_tied_tiny_model(actor, batch, chunk, temperature):
    assert actor.get_output_embeddings().weight is actor.get_input_embeddings().weight
    today = run(actor, batch, chunk_size=chunk, temperature=temperature)
    fused = run(actor, batch, chunk_size=chunk, temperature=temperature, fused=True)
    assert_same(fused, today)


def test_fused_switch_changes_nothing_with_an_untied_head_with_bias(actor, batch):
    old = actor.get_output_embeddings()
    head = torch.nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        head.weight.copy_(old.weight * 0.5)
        head.bias.normal_(generator=torch.Generator().manual_seed(2))
    actor.set_output_embeddings(head)
    assert head.weight is not actor.get_input_embeddings().weight
    assert_same(run(actor, batch, chunk_size=5, temperature=0.6, fused=True), run(actor, batch, temperature=0.6))


def test_fused_refuses_a_zero3_partitioned_output_layer(actor, batch):
    actor.get_output_embeddings().weight.ds_id = 0  # what DeepSpeed ZeRO-3 marks its partitioned parameters with
    with pytest.raises(ValueError, match="model.fused_output=false"):
        actor_token_outputs(actor, *batch, fused=True)


def test_a_given_loss_has_its_gradients_formed_in_the_forward(actor, batch, monkeypatch):
    """``token_loss``: the same values and gradients, and the output layer's product made once per chunk."""
    import lightning_epo.algos.entropy as entropy_lib

    products, product = [], entropy_lib._chunk_logits
    monkeypatch.setattr(entropy_lib, "_chunk_logits", lambda h, *a: products.append(len(h)) or product(h, *a))
    weights = torch.randn(N, L, generator=torch.Generator().manual_seed(1))
    loss = lambda logprob, entropy: (logprob * weights).sum() + (entropy * weights.flip(0)).sum()  # noqa: E731 - run's
    formed = run(actor, batch, chunk_size=5, temperature=0.6, fused=True, token_loss=loss)
    assert products == [5, 5, 5, 2]
    assert_same(formed, run(actor, batch, temperature=0.6))


def test_the_update_with_the_fused_output_layer_makes_each_product_once(compose_cfg, monkeypatch):
    """One RL step (two PPO epochs, several micro-batches, EPO's entropy terms): the parameters of the plain
    path, and the fused backward never recomputes (the loss it is given is the one differentiated)."""
    import lightning_epo.algos.entropy as entropy_lib
    from tests.test_micro_batch_tokens import SGD
    from tests.test_module import fit_one_step, params, synthetic_batch

    backward, recompute = [], entropy_lib._FusedOutputLogprobEntropy.backward

    def counting(ctx, *grads):
        backward.append(ctx.formed is not None)  # formed gradients are there; used unless the upstream differs
        products_before = len(products)
        out = recompute(ctx, *grads)
        backward[-1] = backward[-1] and len(products) == products_before
        return out

    products, product = [], entropy_lib._chunk_logits
    monkeypatch.setattr(entropy_lib, "_chunk_logits", lambda h, *a: products.append(len(h)) or product(h, *a))
    monkeypatch.setattr(entropy_lib._FusedOutputLogprobEntropy, "backward", staticmethod(counting))
    base = ["algo=ppo_epo", "algo.ppo_epochs=2", "algo.mini_batches=2", "algo.micro_batch_size=3", "total_steps=2",
            "model.logits_chunk_size=4", *SGD]
    batches = [synthetic_batch(500, seed=1), synthetic_batch(500, seed=2)]  # step 2 smooths (an entropy window)
    results = [params(fit_one_step(compose_cfg(*base, f"model.fused_output={fused}"), batches)[0])
               for fused in ("false", "true")]
    assert backward and all(backward)
    for name, value in results[0].items():
        torch.testing.assert_close(results[1][name], value, atol=1e-6, rtol=1e-5, msg=name)
