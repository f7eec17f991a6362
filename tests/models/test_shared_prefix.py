"""``model.shared_prefix``: the decoder computes the rows' common prefix once and gives the plain forward's hidden
states, log-probs, entropies, values and gradients, with and without gradient checkpointing."""

from __future__ import annotations

import pytest
import torch

from lightning_epo.models.critic import ValueModel
from lightning_epo.models.loading import load_actor
from lightning_epo.models.policy_outputs import actor_token_outputs
from lightning_epo.models.shared_prefix import decoder_hidden_states, shared_prefix_length

PREFIX, N, L = 7, 4, 20


def prefixed_batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask, response_mask)`` ``[N, L]``: right-padded rows that share their first
    ``PREFIX`` tokens, with responses at different places."""
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, vocab, (N, L), generator=generator)
    input_ids[:, :PREFIX] = input_ids[0, :PREFIX]
    lengths = torch.tensor([20, 15, 18, 10])
    attention_mask = (torch.arange(L) < lengths[:, None]).long()
    response_mask = torch.zeros(N, L, dtype=torch.long)
    for row, length in enumerate(lengths.tolist()):
        response_mask[row, length - 3 : length] = 1
    response_mask[0, PREFIX] = 1  # the first token after the prefix: read from the prefix's last hidden state
    return input_ids, attention_mask, response_mask


@pytest.fixture
def actor(tiny_model_path):
    return load_actor({"name_or_path": tiny_model_path, "dtype": "float32", "attn_implementation": "sdpa"}).train()


def test_shared_prefix_length():
    ids = torch.tensor([[1, 2, 3, 4, 5], [1, 2, 3, 9, 9], [1, 2, 3, 4, 0]])
    ones = torch.ones_like(ids)
    assert shared_prefix_length(ids, ones) == 3
    assert shared_prefix_length(ids[:1], ones[:1]) == 4  # one row: all but its last column
    assert shared_prefix_length(ids[[0, 0]], ones[:2]) == 4  # identical rows: the rows' pass keeps a column
    left_padded = ones.clone()
    left_padded[2, 0] = 0  # a padding column is not shared, even where the ids agree
    assert shared_prefix_length(ids, left_padded) == 0
    right_padded = ones.clone()
    right_padded[1, 2:] = 0
    assert shared_prefix_length(ids, right_padded) == 2
    assert shared_prefix_length(torch.tensor([[1, 2], [2, 2]]), torch.ones(2, 2)) == 0


def run(actor, batch, prefix: int):
    """Log-probs, entropies and every parameter's gradient of a loss on both."""
    actor.zero_grad(set_to_none=True)
    logprob, entropy = actor_token_outputs(actor, *batch, prefix=prefix)
    weights = torch.randn(N, L, generator=torch.Generator().manual_seed(1))
    ((logprob * weights).sum() + (entropy * weights.flip(0)).sum()).backward()
    return logprob.detach(), entropy.detach(), {n: p.grad.clone() for n, p in actor.named_parameters()}


@pytest.mark.parametrize("checkpointing", [False, True])
def test_logprobs_entropies_and_gradients_equal_the_plain_forward(actor, checkpointing):
    """Without the prefix pass's cache kept under gradient checkpointing (transformers drops it), the rows would
    not see the prefix and every value after it would differ."""
    if checkpointing:
        actor.gradient_checkpointing_enable()
    batch = prefixed_batch(actor.config.vocab_size)
    assert shared_prefix_length(*batch[:2]) == PREFIX
    plain, shared = run(actor, batch, 0), run(actor, batch, PREFIX)
    torch.testing.assert_close(shared[0], plain[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(shared[1], plain[1], rtol=1e-5, atol=1e-6)
    assert shared[2].keys() == plain[2].keys()
    for name, grad in plain[2].items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(shared[2][name], grad, rtol=1e-4, atol=1e-5 * grad.abs().max().item(), msg=name)


def test_the_prefix_is_computed_once(actor):
    """The decoder embeds ``[1, P]`` tokens and then ``[N, L - P]``: the prefix is not computed per row."""
    batch = prefixed_batch(actor.config.vocab_size)
    shapes = []
    hook = actor.get_input_embeddings().register_forward_hook(lambda m, args, out: shapes.append(tuple(args[0].shape)))
    decoder_hidden_states(actor.get_decoder(), *batch[:2], PREFIX)
    hook.remove()
    assert shapes == [(1, PREFIX), (N, L - PREFIX)]


def test_critic_values_and_gradients_equal_the_plain_forward(tiny_model_path):
    from transformers import AutoModel

    critic = ValueModel(AutoModel.from_pretrained(tiny_model_path, dtype=torch.float32)).train()
    input_ids, attention_mask, _ = prefixed_batch(critic.backbone.config.vocab_size)
    results = []
    for prefix in (0, PREFIX):
        critic.zero_grad(set_to_none=True)
        values = critic(input_ids, attention_mask, prefix)
        (values * attention_mask).square().sum().backward()
        results.append((values.detach() * attention_mask, {n: p.grad.clone() for n, p in critic.named_parameters()}))
    (plain, plain_grads), (shared, shared_grads) = results
    torch.testing.assert_close(shared, plain, rtol=1e-5, atol=1e-6)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, rtol=1e-4, atol=1e-5 * grad.abs().max().item(), msg=name)
