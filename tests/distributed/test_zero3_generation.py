"""The hf engine under ZeRO-3 samples from a gathered full copy of the actor: the same responses as from the
actor itself, with no collective during generation (faked ZeRO-3: a parameter is an empty shard except inside
GatheredParameters)."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from types import SimpleNamespace

import torch

from lightning_epo.models.loading import load_actor, load_tokenizer
from lightning_epo.models.shards import is_sharded
from lightning_epo.rollout.engine import SamplingParams
from lightning_epo.rollout.hf_engine import HFEngine


def fake_zero3(model: torch.nn.Module, monkeypatch) -> list[int]:
    """Turn ``model``'s parameters into empty "shards"; returns the log of gathers (one entry per gather)."""
    full = {id(p): p.detach().clone() for p in model.parameters()}
    for p in model.parameters():
        p.ds_id = id(p)
        p.data = torch.empty(0)
    gathers: list[int] = []

    @contextmanager
    def gathered(params, modifier_rank=None):
        gathers.append(len(params))
        for p in params:
            p.data = full[p.ds_id].clone()
        yield
        for p in params:
            p.data = torch.empty(0)

    monkeypatch.setitem(sys.modules, "deepspeed", SimpleNamespace(zero=SimpleNamespace(GatheredParameters=gathered)))
    return gathers


def test_hf_engine_samples_the_actors_responses_from_a_gathered_copy(tiny_model_path, monkeypatch):
    cfg = {"name_or_path": tiny_model_path}
    tokenizer = load_tokenizer(cfg)
    prompts = [tokenizer.encode("go north"), tokenizer.encode("open the door and then go east")]
    sampling = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=12)
    plain = HFEngine(tokenizer, model=load_actor(cfg))
    torch.manual_seed(0)
    expected = plain.generate(prompts, sampling)

    sharded = load_actor(cfg)
    gathers = fake_zero3(sharded, monkeypatch)
    assert is_sharded(sharded)
    engine = HFEngine(tokenizer)
    torch.manual_seed(0)
    engine.sync_weights(sharded)
    assert torch.equal(torch.get_rng_state(), torch.manual_seed(0).get_state())  # the copy drew no sampling RNG
    gathered_for_sync = len(gathers)
    assert gathered_for_sync > 0 and not is_sharded(engine.model)
    assert engine.stop_ids() == plain.stop_ids()  # the checkpoint's generation config (two eos ids) came along
    got = engine.generate(prompts, sampling)
    assert [(g.token_ids, g.finish_reason, g.learned) for g in got] == [
        (g.token_ids, g.finish_reason, g.learned) for g in expected
    ]  # the actor's tokens and stop reasons
    for g, e in zip(got, expected):  # two copies of the weights: a matmul may take another kernel path on each
        # (AVX-512: 4.8e-7 apart); float32 rounding stays within 1e-5, other weights move a log-prob far more
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(e.logprobs), rtol=1e-5, atol=1e-5)
    assert len(gathers) == gathered_for_sync  # nothing gathered while generating: ranks may stop anywhere
