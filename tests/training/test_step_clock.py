"""The pieces of an RL step's timing: the clock's parts, the model-FLOPs count, the matmul peak, the step's line."""

from __future__ import annotations

import resource
import time
from pathlib import Path

import pytest
import torch

from lightning_epo.models.loading import load_actor, load_critic
from lightning_epo.models.lora import add_lora
from lightning_epo.models.shared_prefix import Sharing
from lightning_epo.training.step_clock import (StepClock, host_peak_rss_gib, matmul_peak_flops, model_flops_per_token,
                                               perf_metrics, step_line, update_flops)


def model_cfg(path):
    return {"name_or_path": path, "dtype": "float32", "attn_implementation": "sdpa"}


def test_a_part_adds_up_over_its_intervals():
    clock = StepClock(torch.device("cpu"))
    for _ in range(2):
        with clock.part("update"):
            time.sleep(0.02)
    clock.add("weight_sync", 0.5)
    assert 0.04 <= clock.seconds["update"] < 0.2 and clock.seconds["weight_sync"] == 0.5
    assert clock.elapsed() >= clock.seconds["update"]


def test_model_flops_count_the_decoder_once_and_the_output_layer_apart(tiny_model_path):
    """Two FLOPs per parameter per token: the decoder's parameters (not the embeddings) and the [V, d] output layer,
    counted apart since it runs on response tokens only; the critic's backbone has no output layer; LoRA adds none."""
    actor = load_actor(model_cfg(tiny_model_path))
    d, vocab = actor.config.hidden_size, actor.config.vocab_size
    decoder = sum(p.numel() for name, p in actor.named_parameters() if "embed_tokens" not in name
                  and "lm_head" not in name)
    assert model_flops_per_token(actor) == (2.0 * decoder, 2.0 * d * vocab)
    critic = load_critic(model_cfg(tiny_model_path))
    assert model_flops_per_token(critic.backbone) == (2.0 * decoder, 0.0)
    lora = add_lora(actor, {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": "all-linear"}, "CAUSAL_LM")
    assert model_flops_per_token(lora) == (2.0 * decoder, 2.0 * d * vocab)


def test_the_update_counts_the_positions_its_passes_computed(tiny_model_path):
    """A forward and a backward (two forwards' worth where the weights train, one for LoRA's frozen base) over the
    decoder positions the update's micro-batches computed and the output layer over the response tokens; a critic
    adds its backbone over the same positions. The positions come from the passes (``Sharing.decoder_positions``): a
    shared prefix computed once is counted once (the batch's tokens put the SmolLM2 recipe at 184 % of the peak)."""
    actor = load_actor(model_cfg(tiny_model_path))
    body, output = model_flops_per_token(actor)
    assert update_flops(actor, None, 1000.0, 30.0) == pytest.approx(3.0 * (body * 1000 + output * 30), rel=1e-12)
    critic = load_critic(model_cfg(tiny_model_path))
    assert update_flops(actor, critic, 1000.0, 30.0) == pytest.approx(3.0 * (body * 2000 + output * 30), rel=1e-12)
    lora = add_lora(actor, {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": "all-linear"}, "CAUSAL_LM")
    assert update_flops(lora, None, 1000.0, 30.0) == pytest.approx(2.0 * (body * 1000 + output * 30), rel=1e-12)


def test_with_adapters_on_the_top_layers_the_backward_is_counted_from_the_lowest_adapted_layer(tiny_model_path):
    """``model.lora.top_layers``: the layers below the adapted ones get no backward pass, and are counted once."""
    actor = load_actor(model_cfg(tiny_model_path))
    body, output = model_flops_per_token(actor)
    first = 2.0 * sum(p.numel() for p in actor.model.layers[0].parameters())  # a forward's FLOPs a position
    top = add_lora(actor, {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": "all-linear", "top_layers": 1},
                   "CAUSAL_LM")
    assert actor.config.num_hidden_layers == 2
    forward = body * 1000 + output * 30
    assert update_flops(top, None, 1000.0, 30.0) == pytest.approx(forward + forward - first * 1000, rel=1e-12)


def test_a_pass_adds_the_positions_its_decoder_computes_and_its_response_tokens():
    clock, ids, responses = StepClock(torch.device("cpu")), torch.zeros(4, 10, dtype=torch.long), torch.zeros(4, 10)
    responses[:, -3:] = 1
    for sharing in (Sharing(), Sharing(prefix=6)):
        assert clock.count_pass(sharing, ids, responses) is sharing
    assert (clock.decoder_positions, int(clock.logit_positions)) == (4 * 10 + 6 + 4 * 4, 2 * 12)


def test_the_matmul_peak_is_a_measured_rate():
    peak = matmul_peak_flops("cpu", torch.float32)
    assert 1e9 < peak < 1e13  # between a GFLOP/s and ten TFLOP/s on any CPU
    assert matmul_peak_flops("cpu", torch.float32) == peak  # measured once per process


def test_the_step_line_names_every_part_present():
    seconds = {"perf/step_s": 10.0, "perf/rollout_s": 4.0, "perf/gen_s": 3.0, "perf/env_s": 0.5,
               "perf/old_logprob_s": 1.0, "perf/values_s": 0.5, "perf/update_s": 4.0, "perf/weight_sync_s": 0.01,
               "perf/update_flops_per_s": 50e9, "perf/host_peak_rss_gib": 20.46, "perf/host_released_gib": 6.94}
    line = step_line(3, seconds, peak=100e9)
    assert line == ("step 3 took 10.0 s: rollout 4.0 s (gen 3.0, env 0.5), old policy 1.5 s (log-probs 1.0, values 0.5), "
                    "update 4.0 s at 50.0 GFLOP/s (50 % of the matmul peak, 100.0 GFLOP/s), weight push 0.01 s, "
                    "host memory at most 20.5 GiB (6.9 GiB freed by the update handed back)")


def test_the_step_line_leaves_out_an_old_policy_pass_that_did_not_run():
    """An on-policy GRPO step without KL has no old-policy pass (the update's forward gives its outputs)."""
    seconds = {"perf/step_s": 6.0, "perf/rollout_s": 2.0, "perf/gen_s": 1.5, "perf/env_s": 0.5, "perf/update_s": 4.0,
               "perf/weight_sync_s": 0.01, "perf/update_flops_per_s": 50e9}
    line = step_line(0, seconds, peak=100e9)
    assert "old policy" not in line and line.startswith("step 0 took 6.0 s: rollout 2.0 s (gen 1.5, env 0.5), update 4.0 s")


class FakeAllocator:
    """torch.cuda's peak-memory counter on a machine without CUDA: ``allocate`` raises the peak, a reset lowers it
    to what is held now."""

    def __init__(self, monkeypatch):
        self.held = self.peak = 0
        monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: self.peak)
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: setattr(self, "peak", self.held))

    def allocate(self, nbytes: int) -> None:
        self.peak = max(self.peak, self.held + nbytes)


def test_a_part_keeps_its_own_peak_memory_and_the_step_keeps_the_largest(monkeypatch):
    """The rollout's 7 GiB peak (before any timed part) stays the step's; the update's own is its 5 GiB, not 7."""
    allocator, gib = FakeAllocator(monkeypatch), 2**30
    clock = StepClock(torch.device("cpu"))
    clock.device = torch.device("cuda")  # a CUDA step's clock; its counters stay on this machine's CPU
    allocator.allocate(7 * gib)  # generation's KV cache, freed before the update
    with clock.part("update"):
        allocator.allocate(5 * gib)
    with clock.part("weight_sync"):
        allocator.allocate(1 * gib)
    clock.fold_peak()
    assert clock.peak_bytes == {"step": 7 * gib, "update": 5 * gib, "weight_sync": 1 * gib}


def test_a_part_on_the_cpu_keeps_no_peak_memory():
    clock = StepClock(torch.device("cpu"))
    with clock.part("update"):
        pass
    clock.fold_peak()
    assert clock.peak_bytes == {}


STATM = Path("/proc/self/statm")


@pytest.mark.skipif(not STATM.exists(), reason="reads the resident size from Linux's /proc/self/statm")
def test_the_host_memory_figure_is_the_process_peak_and_rises_when_it_holds_more():
    """A step's ``perf/host_peak_rss_gib`` is the process's own high-water mark: holding 256 MiB past it (pages
    written, so resident) raises it by about that much, which a figure of the machine or of torch's allocator would
    not show."""
    clock = StepClock(torch.device("cpu"))
    clock.add("update", 1.0)

    def figure() -> float:
        return perf_metrics(clock, 1e9, 1e10, lambda t, op="sum": t, world_size=1)["perf/host_peak_rss_gib"]

    before = figure()
    resident = int(STATM.read_text().split()[1]) * resource.getpagesize() / 2**30
    held = torch.ones(int((before - resident + 0.25) * 2**30), dtype=torch.uint8)
    after = figure()
    assert host_peak_rss_gib() == pytest.approx(after, abs=0.01)
    assert after - before == pytest.approx(0.25, abs=0.05), (before, resident, after)
    del held
