"""``model.shared_prefix`` and ``model.fold_turns``: the decoder computes the rows' common prefix once, and a row
that begins another row not at all, and gives the plain forward's hidden states, log-probs, entropies, values and
gradients at every real position, with and without gradient checkpointing."""

from __future__ import annotations

import pytest
import torch

from lightning_epo.models.critic import ValueModel
from lightning_epo.models.loading import load_actor
from lightning_epo.models.policy_outputs import actor_token_outputs
from lightning_epo.models.shared_prefix import Sharing, decoder_hidden_states, prefix_hosts, shared_prefix_length

PREFIX, N, L = 7, 6, 20
HOSTS = torch.tensor([0, 0, 2, 2, 4, 0])  # rows 1 and 5 begin row 0, row 3 begins row 2


def prefixed_batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask, response_mask)`` ``[N, L]``: right-padded rows that share their first
    ``PREFIX`` tokens, with responses (each row's last 3 tokens) at different places; as an earlier turn's row
    begins a later turn's, rows 1 and 5 (identical) begin row 0 and row 3 begins row 2 (:data:`HOSTS`)."""
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, vocab, (N, L), generator=generator)
    input_ids[:, :PREFIX] = input_ids[0, :PREFIX]
    input_ids[[1, 5]], input_ids[3] = input_ids[0].clone(), input_ids[2].clone()
    lengths = torch.tensor([20, 15, 18, 10, 12, 15])
    attention_mask = (torch.arange(L) < lengths[:, None]).long()
    input_ids[attention_mask == 0] = 0  # padding
    response_mask = torch.zeros(N, L, dtype=torch.long)
    for row, length in enumerate(lengths.tolist()):
        response_mask[row, length - 3 : length] = 1
    response_mask[4, PREFIX] = 1  # the first token after the prefix: read from the prefix's last hidden state
    return input_ids, attention_mask, response_mask


SHARINGS = {"prefix": Sharing(PREFIX), "fold": Sharing.from_hosts(HOSTS), "prefix+fold": Sharing.from_hosts(HOSTS, PREFIX)}


@pytest.fixture(params=["sdpa", "eager"])
def actor(tiny_model_path, request):
    """The tiny actor with each attention a config can pick on CPU (``model.attn_implementation``): the rows' pass
    reaches attention with the prefix's keys and values and an explicit mask, which each implements on its own."""
    model_cfg = {"name_or_path": tiny_model_path, "dtype": "float32", "attn_implementation": request.param}
    return load_actor(model_cfg).train()


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


def test_prefix_hosts_reads_each_row_from_the_longest_row_it_begins():
    batch = prefixed_batch(100)
    assert torch.equal(prefix_hosts(*batch[:2]), HOSTS)
    ids = torch.tensor([[1, 2, 0, 0], [1, 2, 3, 4], [1, 2, 3, 0], [1, 2, 5, 0], [2, 0, 0, 0]])
    mask = (ids != 0).long()
    hosts = prefix_hosts(ids, mask).tolist()
    assert hosts[1:] == [1, 1, 3, 4]  # [1, 2, 3] begins [1, 2, 3, 4]; [1, 2, 5] and [2] begin nothing
    assert hosts[0] in (1, 3)  # [1, 2] begins both: either is a host
    mask[1, 3] = 0  # a padded column is not a token: [1, 2, 3] is now identical to row 1
    assert prefix_hosts(ids, mask)[1:3].tolist() in ([1, 1], [2, 2])


def run(actor, batch, sharing: Sharing):
    """Log-probs, entropies and every parameter's gradient of a loss on both."""
    actor.zero_grad(set_to_none=True)
    logprob, entropy = actor_token_outputs(actor, *batch, sharing=sharing)
    weights = torch.randn(N, L, generator=torch.Generator().manual_seed(1))
    ((logprob * weights).sum() + (entropy * weights.flip(0)).sum()).backward()
    return logprob.detach(), entropy.detach(), {n: p.grad.clone() for n, p in actor.named_parameters()}


@pytest.mark.parametrize("sharing", SHARINGS)
@pytest.mark.parametrize("checkpointing", [False, True])
def test_logprobs_entropies_and_gradients_equal_the_plain_forward(actor, checkpointing, sharing):
    """Without the prefix pass's cache kept under gradient checkpointing (transformers drops it), the rows would
    not see the prefix and every value after it would differ."""
    if checkpointing:
        actor.gradient_checkpointing_enable()
    batch = prefixed_batch(actor.config.vocab_size)
    assert shared_prefix_length(*batch[:2]) == shared_prefix_length(batch[0][[0, 2, 4]], batch[1][[0, 2, 4]]) == PREFIX
    plain, shared = run(actor, batch, Sharing()), run(actor, batch, SHARINGS[sharing])
    torch.testing.assert_close(shared[0], plain[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(shared[1], plain[1], rtol=1e-5, atol=1e-6)
    assert shared[2].keys() == plain[2].keys()
    for name, grad in plain[2].items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(shared[2][name], grad, rtol=1e-4, atol=1e-5 * grad.abs().max().item(), msg=name)


@pytest.mark.parametrize(("sharing", "embedded"), [("prefix", [(1, PREFIX), (N, L - PREFIX)]), ("fold", [(3, L)]),
                                                   ("prefix+fold", [(1, PREFIX), (3, L - PREFIX)]), ("none", [(N, L)])])
def test_shared_tokens_are_computed_once(actor, sharing, embedded):
    """The decoder embeds the prefix once (``[1, P]``), then the rows' remainders; folded, only the 3 hosts. The
    positions it computes are what ``Sharing.decoder_positions`` counts for the update's FLOPs (step_clock.py)."""
    batch = prefixed_batch(actor.config.vocab_size)
    shapes = []
    hook = actor.get_input_embeddings().register_forward_hook(lambda m, args, out: shapes.append(tuple(args[0].shape)))
    chosen = SHARINGS.get(sharing, Sharing())
    decoder_hidden_states(actor.get_decoder(), *batch[:2], chosen)
    hook.remove()
    assert shapes == embedded
    assert chosen.decoder_positions(N, L) == sum(rows * columns for rows, columns in embedded)


@pytest.mark.parametrize("sharing", SHARINGS)
def test_critic_values_and_gradients_equal_the_plain_forward(tiny_model_path, sharing):
    from transformers import AutoModel

    critic = ValueModel(AutoModel.from_pretrained(tiny_model_path, dtype=torch.float32)).train()
    input_ids, attention_mask, _ = prefixed_batch(critic.backbone.config.vocab_size)
    results = []
    for shared in (Sharing(), SHARINGS[sharing]):
        critic.zero_grad(set_to_none=True)
        values = critic(input_ids, attention_mask, shared)
        (values * attention_mask).square().sum().backward()
        results.append((values.detach() * attention_mask, {n: p.grad.clone() for n, p in critic.named_parameters()}))
    (plain, plain_grads), (shared, shared_grads) = results
    torch.testing.assert_close(shared, plain, rtol=1e-5, atol=1e-6)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, rtol=1e-4, atol=1e-5 * grad.abs().max().item(), msg=name)


class _EmbeddingDecoder(torch.nn.Module):
    """A decoder whose hidden states are its input embeddings (``[N, L, 512]``): what folding does to the gradient,
    with nothing else in the backward."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(64, 512)

    def forward(self, input_ids, attention_mask, use_cache):
        return type("Output", (), {"last_hidden_state": self.embed(input_ids)})


def test_folded_rows_give_the_same_gradient_bits_on_every_backward():
    """The same computation on the same tensors on two threads gives the same bits (identity is the point: DESIGN's
    bit-for-bit promise). Reading each folded row from its host gathers the hosts' hidden states with
    repeated indices; the gather's backward adds each host's rows into it. Indexed (``hidden[source]``), that sum ran
    as atomic float adds across threads on a CPU in any order, and two identical runs parted at RL step 1."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        decoder = _EmbeddingDecoder()
        hosts = torch.arange(16) % 4  # rows 4, 8 and 12 begin row 0, rows 5, 9 and 13 row 1, ...
        input_ids = torch.randint(0, 64, (16, 64), generator=torch.Generator().manual_seed(0))
        weights = torch.randn(16, 64, 512, generator=torch.Generator().manual_seed(1))
        grads = []
        for _ in range(100):
            decoder.zero_grad(set_to_none=True)
            hidden = decoder_hidden_states(decoder, input_ids, torch.ones_like(input_ids), Sharing.from_hosts(hosts))
            (hidden * weights).sum().backward()
            grads.append(decoder.embed.weight.grad)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(grad, grads[0]) for grad in grads)
