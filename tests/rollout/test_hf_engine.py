"""HFEngine: sampled ids, their log-probs, padding, stop handling and model state."""

from __future__ import annotations

import copy

import pytest
import torch

from lightning_epo.core.errors import TrainingDiverged
from lightning_epo.rollout.engine import SamplingParams
from lightning_epo.rollout.hf_engine import HFEngine, _top_p_filter, length_buckets

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=10)


@pytest.fixture
def prompts(tokenizer) -> list[list[int]]:
    texts = ["<|im_start|>user\nlook<|im_end|>\n<|im_start|>assistant\n", "go to fridge 1 and take apple 1", "a"]
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


def _scored_logprobs(model, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    """Log-probs of ``response`` after ``prompt`` from one plain forward pass (no cache, no padding)."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    logprobs = torch.log_softmax(logits / (temperature or 1.0), -1)
    return logprobs.gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


@pytest.mark.parametrize("temperature, top_p", [(0.7, 0.9), (1.0, 1.0), (0.0, 1.0)])
def test_logprobs_score_the_generated_ids(tokenizer, model, prompts, temperature, top_p):
    torch.manual_seed(1)
    engine = HFEngine(tokenizer, model)
    generations = engine.generate(prompts, SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=12))
    for prompt, generation in zip(prompts, generations):
        assert len(generation.token_ids) == len(generation.logprobs) > 0
        expected = _scored_logprobs(model, prompt, generation.token_ids, temperature)
        torch.testing.assert_close(torch.tensor(generation.logprobs), expected, atol=1e-4, rtol=0)


def test_left_padding_does_not_change_greedy_output(tokenizer, model, prompts):
    engine = HFEngine(tokenizer, model)
    together = engine.generate(prompts, GREEDY)
    alone = [engine.generate([p], GREEDY)[0] for p in prompts]
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]
    for a, b in zip(together, alone):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)


def test_chunks_of_batch_size_give_the_same_outputs(tokenizer, model, prompts):
    many, sampling = prompts * 2, SamplingParams(temperature=0.0, max_new_tokens=6)
    whole = HFEngine(tokenizer, model, batch_size=64).generate(many, sampling)
    chunked = HFEngine(tokenizer, model, batch_size=4).generate(many, sampling)
    assert [g.token_ids for g in chunked] == [g.token_ids for g in whole]


def test_temperature_zero_is_deterministic(tokenizer, model, prompts):
    engine = HFEngine(tokenizer, model)
    torch.manual_seed(3)
    first = engine.generate(prompts, GREEDY)
    torch.manual_seed(4)
    second = engine.generate(prompts, GREEDY)
    assert [g.token_ids for g in first] == [g.token_ids for g in second]


def test_tiny_top_p_samples_the_greedy_token(tokenizer, model, prompts):
    engine = HFEngine(tokenizer, model)
    greedy = engine.generate(prompts, GREEDY)
    torch.manual_seed(5)
    nucleus = engine.generate(prompts, SamplingParams(temperature=1.0, top_p=1e-6, max_new_tokens=10))
    assert [g.token_ids for g in nucleus] == [g.token_ids for g in greedy]


def test_stop_token_ends_the_response_and_is_kept(tokenizer, model, prompts):
    sampling = SamplingParams(temperature=1.0, max_new_tokens=10)
    torch.manual_seed(7)
    reference = HFEngine(tokenizer, model).generate(prompts[:1], sampling)[0].token_ids
    cut = next(i for i, t in enumerate(reference) if i >= 2 and t not in reference[:i])
    engine = HFEngine(tokenizer, model, stop_token_ids=[reference[cut]])

    torch.manual_seed(7)
    stopped = engine.generate(prompts[:1], sampling)[0]
    assert stopped.token_ids == reference[: cut + 1]
    assert stopped.finish_reason == "stop"

    torch.manual_seed(7)
    capped = engine.generate(prompts[:1], SamplingParams(temperature=1.0, max_new_tokens=cut))[0]
    assert capped.token_ids == reference[:cut]
    assert capped.finish_reason == "length"


def test_finish_reason_is_length_exactly_without_a_stop_token(tokenizer, model, prompts):
    torch.manual_seed(6)
    engine = HFEngine(tokenizer, model, stop_token_ids=list(range(3, 60)))  # ~1 in 5 tokens stops
    stop = set(engine.stop_ids())
    sampling = SamplingParams(temperature=1.0, max_new_tokens=6)
    generations = engine.generate(prompts * 10, sampling)
    assert {g.finish_reason for g in generations} == {"stop", "length"}
    for g in generations:
        assert not stop.intersection(g.token_ids[:-1])
        if g.finish_reason == "stop":
            assert g.token_ids[-1] in stop
        else:
            assert len(g.token_ids) == sampling.max_new_tokens and g.token_ids[-1] not in stop


def test_stop_ids_include_tokenizer_and_model_eos(tokenizer, model):
    engine = HFEngine(tokenizer, model, stop_token_ids=[7])
    assert engine.stop_ids() == sorted({7, tokenizer.eos_token_id, model.generation_config.eos_token_id})


def test_no_stop_token_at_all_is_one_error_naming_the_setting():
    from types import SimpleNamespace

    from lightning_epo.core.errors import UserError
    from lightning_epo.rollout.engine import stop_token_ids

    with pytest.raises(UserError, match="set rollout.engine.stop_token_ids"):
        stop_token_ids(SimpleNamespace(eos_token_id=None), None, None)
    assert stop_token_ids(SimpleNamespace(eos_token_id=None), [3, 1], [1, 5]) == [1, 3, 5]


@pytest.mark.parametrize("was_training", [True, False])
def test_generates_in_eval_mode_and_restores_training_mode(tokenizer, model, prompts, was_training):
    seen = []
    hook = model.register_forward_pre_hook(lambda module, args: seen.append(module.training))
    model.train(was_training)
    try:
        HFEngine(tokenizer, model).generate(prompts, GREEDY)
        assert model.training is was_training
    finally:
        hook.remove()
        model.eval()
    assert seen and not any(seen)


def test_sync_weights_binds_the_actor(tokenizer, model, prompts):
    engine = HFEngine(tokenizer)
    with pytest.raises(RuntimeError, match="sync_weights"):
        engine.generate(prompts, GREEDY)
    engine.sync_weights(model)
    assert engine.model is model
    assert len(engine.generate(prompts, GREEDY)) == len(prompts)


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_non_finite_logits_are_a_diverged_policy_not_a_sampling_crash(tokenizer, model, prompts, top_p):
    diverged = copy.deepcopy(model)
    with torch.no_grad():
        diverged.lm_head.weight[0, 0] = float("nan")  # tied: every logit of every step is NaN
    with pytest.raises(TrainingDiverged, match="logits .* not finite"):
        HFEngine(tokenizer, diverged).generate(prompts, SamplingParams(temperature=1.0, top_p=top_p, max_new_tokens=4))


@pytest.mark.parametrize(
    "sampling, match",
    [
        (SamplingParams(temperature=-1.0), "temperature"),
        (SamplingParams(top_p=0.0), "top_p"),
        (SamplingParams(max_new_tokens=0), "max_new_tokens"),
    ],
)
def test_bad_sampling_params_fail_clearly(tokenizer, model, prompts, sampling, match):
    with pytest.raises(ValueError, match=match):
        HFEngine(tokenizer, model).generate(prompts, sampling)


def test_top_p_keeps_the_smallest_set_reaching_the_mass():
    scores = torch.tensor([[0.15, 0.5, 0.05, 0.3]]).log()

    def kept(top_p: float) -> list[bool]:
        return torch.isfinite(_top_p_filter(scores, top_p))[0].tolist()

    assert kept(0.5) == [False, True, False, False]
    assert kept(0.75) == [False, True, False, True]
    assert kept(0.85) == [True, True, False, True]
    assert kept(1e-9) == [False, True, False, False]


@pytest.fixture
def shared_prefix_prompts(tokenizer) -> list[list[int]]:
    """Prompts as the collector builds them: the same chat template and instruction, then each its own state."""
    head = "<|im_start|>system\nYou are an expert agent in a grid.<|im_end|>\n<|im_start|>user\nYour task is to: "
    tails = ["pick up the key", "open the door 1 step north", "go"]
    return [tokenizer.encode(head + tail, add_special_tokens=False) for tail in tails]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_prefix_every_prompt_shares_is_computed_once_with_the_same_logprobs(tokenizer, model, shared_prefix_prompts,
                                                                              temperature):
    """The chunk's common prompt prefix (chat template, system prompt, instruction) is run once and its KV cache
    shared by every row: the prefill reads each shared token once, and each response's log-probs still score
    its ids under a plain forward of its whole prompt."""
    prompts = shared_prefix_prompts
    shared = next(i for i, column in enumerate(zip(*prompts)) if len(set(column)) > 1)
    assert shared > 10
    read: list[int] = []
    hook = model.register_forward_pre_hook(lambda _, args, kwargs: read.append(kwargs["input_ids"].numel()),
                                           with_kwargs=True)
    try:
        torch.manual_seed(0)
        generations = HFEngine(tokenizer, model).generate(prompts, SamplingParams(temperature, 1.0, 8))
    finally:
        hook.remove()
    own = sorted(len(p) - shared for p in prompts)
    assert own[0] * 2 < own[-1]  # lengths far apart: no two rows share a padded forward
    prefill = [n for n in read if n != len(prompts)]  # the decoding steps read one token a row
    assert prefill == [shared, *own[::-1]]  # the shared prefix once, then each row's own tokens, no padding
    for prompt, generation in zip(prompts, generations):
        expected = _scored_logprobs(model, prompt, generation.token_ids, temperature)
        torch.testing.assert_close(torch.tensor(generation.logprobs), expected, atol=1e-4, rtol=0)


def test_identical_prompts_are_prefilled_once_and_sampled_apart(tokenizer, model, shared_prefix_prompts):
    """The rollouts of one GRPO group begin with the same prompt: the prefill runs once per distinct prompt, its
    cache serves every row that has it, each row still samples its own response, and every response's log-probs
    score its ids under a plain forward of its prompt."""
    first, second, _ = shared_prefix_prompts
    prompts = [first, second, first, first, second]
    shared = next(i for i, column in enumerate(zip(first, second)) if column[0] != column[1])
    read: list[int] = []
    hook = model.register_forward_pre_hook(lambda _, args, kwargs: read.append(kwargs["input_ids"].numel()),
                                           with_kwargs=True)
    try:
        torch.manual_seed(0)
        generations = HFEngine(tokenizer, model).generate(prompts, SamplingParams(1.0, 1.0, 12))
    finally:
        hook.remove()
    prefill = [n for n in read if n != len(prompts)]
    assert sum(prefill) == shared + len(first) - shared + len(second) - shared  # two distinct prompts, no padding
    assert len({tuple(generations[i].token_ids) for i in (0, 2, 3)}) > 1  # the copies sample apart
    for prompt, generation in zip(prompts, generations):
        expected = _scored_logprobs(model, prompt, generation.token_ids, 1.0)
        torch.testing.assert_close(torch.tensor(generation.logprobs), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "lengths,buckets",
    [
        ([500, 100, 480, 120, 900], [[4], [0, 2], [3, 1]]),  # longest first; 100 joins 120 (20 pads of 220 tokens)
        ([156] * 4, [[0, 1, 2, 3]]),                          # equal lengths: one forward, no padding
        ([10, 1], [[0], [1]]),
    ],
)
def test_rows_are_prefilled_in_buckets_of_similar_length(lengths, buckets):
    assert length_buckets(lengths, max_padding=0.1) == buckets
    for bucket in length_buckets(lengths, max_padding=0.1):
        padded = max(lengths[i] for i in bucket) * len(bucket)
        assert padded <= 1.1 * sum(lengths[i] for i in bucket)


def test_prompts_of_very_different_lengths_sample_as_each_alone(tokenizer, model, shared_prefix_prompts):
    """Rows prefilled in different buckets, then decoded together in one batch: the same greedy ids and
    log-probs as each prompt alone."""
    prompts = [shared_prefix_prompts[1], shared_prefix_prompts[2], shared_prefix_prompts[1] + shared_prefix_prompts[0]]
    engine = HFEngine(tokenizer, model)
    together = engine.generate(prompts, GREEDY)
    alone = [engine.generate([p], GREEDY)[0] for p in prompts]
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]
    for prompt, generation in zip(prompts, together):
        expected = _scored_logprobs(model, prompt, generation.token_ids, 0.0)
        torch.testing.assert_close(torch.tensor(generation.logprobs), expected, atol=1e-4, rtol=0)


def test_prompts_of_nearly_equal_lengths_share_one_forward_in_their_order(tokenizer, model, shared_prefix_prompts):
    """Rows within the bucket's padding bound (here the shorter one first) are prefilled in one forward and keep
    their order: each samples as it would alone."""
    long = shared_prefix_prompts[1]
    prompts = [long[:-1], long + long[-1:]]  # lengths n - 1 and n + 1
    assert length_buckets([len(p) for p in prompts]) == [[1, 0]]
    engine = HFEngine(tokenizer, model)
    together = engine.generate(prompts, GREEDY)
    alone = [engine.generate([p], GREEDY)[0] for p in prompts]
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]
