"""The CPU float32 bound of benchmarks/vllm_logprob_check.py: each stack's log-probs against the float64 ones."""

from __future__ import annotations

import pytest
import torch

from benchmarks.vllm_logprob_check import as_exact_as_the_trainer, float32_errors, trainer_logprobs
from lightning_epo.models.loading import load_actor
from lightning_epo.rollout.engine import Generation

PROMPTS = [[5, 6, 7, 8], [9, 10]]
RESPONSES = [[11, 12, 13], [14, 15, 16, 17]]


@pytest.fixture(scope="module")
def actor(tiny_model_path):
    return load_actor({"name_or_path": tiny_model_path, "dtype": "float32"}).eval()


def generations(actor, offset: float) -> list[Generation]:
    """Responses whose engine log-probs are the trainer's own float32 ones plus ``offset``."""
    return [
        Generation(response, (trainer_logprobs(actor, prompt, response) + offset).tolist(), "length")
        for prompt, response in zip(PROMPTS, RESPONSES)
    ]


def test_an_engine_as_exact_as_the_trainer_passes(actor):
    engine_error, trainer_error = float32_errors(actor, PROMPTS, generations(actor, 0.0))
    assert engine_error.shape == trainer_error.shape == (7,) and engine_error.dtype == torch.float64
    torch.testing.assert_close(engine_error, trainer_error)
    assert 0 < trainer_error.max() < 1e-5  # float32 rounding, measured against a float64 forward
    assert as_exact_as_the_trainer(1e-3, engine_error, trainer_error)  # passes by the ratio alone


def test_an_engine_further_from_exact_fails_unless_within_the_absolute_bound(actor):
    engine_error, trainer_error = float32_errors(actor, PROMPTS, generations(actor, 1e-4))
    assert engine_error.min() > 9e-5  # the offset, seen against float64
    assert not as_exact_as_the_trainer(1e-4, engine_error, trainer_error)
    assert as_exact_as_the_trainer(5e-6, engine_error, trainer_error)


@pytest.mark.vllm
def test_the_check_runs_the_engine_alone_in_bf16(vllm_env, tiny_model_path):
    """``--engine-dtype bfloat16`` (what ``rollout.engine.dtype=bfloat16`` alone runs): vLLM in bf16, the trainer in
    float32. The report names both, and the log-probs differ by bf16's rounding, not float32's (with the engine in
    float32 the tiny model's two stacks differ by about 1e-6: benchmarks/RESULTS.md section 11)."""
    from benchmarks.vllm_logprob_check import check

    report = check({"name_or_path": tiny_model_path, "dtype": "float32"}, prompts=4, max_new_tokens=16,
                   engine_dtype="bfloat16")
    assert (report["dtype"], report["trainer_dtype"]) == ("bfloat16", "float32")
    assert report["mean_abs_diff"] > 1e-4, report
    assert "vllm_max_error_vs_float64" not in report  # the float32 bound is not applied to a bf16 engine
