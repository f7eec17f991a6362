"""``model.lora.r=8`` end to end: a run trains the adapters only, exports the merged model and the adapter, and
resumes exactly."""

from __future__ import annotations

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from test_exact_resume import FAST as RESUME_FAST
from test_exact_resume import logged
from test_warm_start import FAST, actor_in
from transformers import AutoModelForCausalLM

from lightning_epo.models.policy_outputs import actor_token_outputs
from lightning_epo.runtime.run import run

LORA = ["model.lora.r=8", "algo.kl_coef=0.05"]  # with the KL term: the reference is the adapter-free base


def test_a_lora_run_trains_only_the_adapters_and_exports_the_merged_model_and_the_adapter(
    compose_cfg, tmp_path, tiny_model_path
):
    run(compose_cfg(*FAST, *LORA, "total_steps=2", "export_policy=true"))
    actor = actor_in(tmp_path / "run" / "checkpoints" / "last.ckpt")
    initial = load_file(f"{tiny_model_path}/model.safetensors")
    base = {k.removeprefix("base_model.model.").replace(".base_layer.", "."): v for k, v in actor.items()
            if "lora_" not in k}
    assert base.keys() == initial.keys() | {"lm_head.weight"}  # the tied output layer appears in the state dict
    assert all(torch.equal(initial[k], base[k]) for k in initial)  # the base model is frozen: never written
    assert any(not torch.all(v == 0) for k, v in actor.items() if "lora_B" in k)  # the adapters learned

    policy = tmp_path / "run" / "policy"
    adapter = load_file(str(policy / "adapter" / "adapter_model.safetensors"))
    assert adapter.keys() == {k.replace(".default.", ".") for k in actor if "lora_" in k}
    assert all(torch.equal(actor[k], adapter[k.replace(".default.", ".")]) for k in actor if "lora_" in k)  # copies
    merged = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)  # what model.name_or_path loads
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_path), policy / "adapter")
    ids = torch.randint(merged.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        expected = actor_token_outputs(adapted, ids, mask, mask)[0]
        torch.testing.assert_close(actor_token_outputs(merged, ids, mask, mask)[0], expected, atol=1e-5, rtol=1e-4)


def test_a_lora_run_resumes_exactly(compose_cfg, tmp_path):
    run(compose_cfg(*RESUME_FAST, *LORA, f"run_dir={tmp_path / 'whole'}"))
    run(compose_cfg(*RESUME_FAST, *LORA, "stop_at_step=3", f"run_dir={tmp_path / 'split'}"))
    run(compose_cfg(*RESUME_FAST, *LORA, "ckpt_path=last", f"run_dir={tmp_path / 'split'}"))
    whole, resumed = logged(tmp_path / "whole"), logged(tmp_path / "split")
    for step in range(6):
        assert "loss/kl" in whole[step] and resumed[step].keys() == whole[step].keys(), step
        for name, value in whole[step].items():
            assert resumed[step][name] == pytest.approx(value, rel=1e-6, abs=1e-9), (step, name)
