"""Loading tokenizer / actor / critic / reference from the model config, and its one-line errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, Qwen2ForCausalLM

from lightning_epo.core.errors import UserError
from lightning_epo.models.critic import ValueModel
from lightning_epo.models.loading import (
    ModelLoadError,
    load_actor,
    load_critic,
    load_reference,
    load_tokenizer,
    model_source,
)


def model_cfg(name_or_path, **overrides):
    """A model config as Hydra composes it (a DictConfig), defaults like conf/model/tiny.yaml."""
    cfg = {
        "name_or_path": str(name_or_path),
        "build_if_missing": False,
        "dtype": "float32",
        "attn_implementation": "sdpa",
        "trust_remote_code": False,
        "gradient_checkpointing": False,
        "revision": None,
    }
    return OmegaConf.create({**cfg, **overrides})


def test_tokenizer_has_pad_token_and_left_padding(tiny_model_path):
    tokenizer = load_tokenizer(model_cfg(tiny_model_path))
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.padding_side == "left"
    assert load_tokenizer(model_cfg(tiny_model_path, padding_side="right")).padding_side == "right"
    with pytest.raises(ModelLoadError, match="model.padding_side='middle' is not valid; choose one of: left, right"):
        load_tokenizer(model_cfg(tiny_model_path, padding_side="middle"))


def test_missing_pad_token_falls_back_to_eos(tiny_model_path, tmp_path):
    copy = Path(shutil.copytree(tiny_model_path, tmp_path / "no_pad"))
    config_file = copy / "tokenizer_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "pad_token": None}))
    tokenizer = load_tokenizer(model_cfg(copy))
    assert tokenizer.pad_token == tokenizer.eos_token == "<|im_end|>"


def test_actor_and_reference_hold_the_saved_weights(tiny_model_path):
    actor = load_actor(model_cfg(tiny_model_path))
    reference = load_reference(model_cfg(tiny_model_path))
    assert isinstance(actor, Qwen2ForCausalLM) and isinstance(reference, Qwen2ForCausalLM)
    saved = load_file(Path(tiny_model_path) / "model.safetensors")
    for name, tensor in saved.items():
        torch.testing.assert_close(actor.state_dict()[name], tensor, rtol=0, atol=0)  # a copy: identity is the point
    assert all(p.requires_grad for p in actor.parameters())
    assert not any(p.requires_grad for p in reference.parameters()) and not reference.training
    ids = torch.tensor([[1, 5, 9, 200, 7]])
    torch.testing.assert_close(actor(ids).logits, reference(ids).logits)


def test_dtype_and_gradient_checkpointing_settings_apply(tiny_model_path):
    cfg = model_cfg(tiny_model_path, dtype="bfloat16", gradient_checkpointing=True)
    actor, critic = load_actor(cfg), load_critic(cfg)
    assert {p.dtype for p in actor.parameters()} == {torch.bfloat16}
    assert actor.is_gradient_checkpointing and critic.backbone.is_gradient_checkpointing
    plain = load_actor(model_cfg(tiny_model_path))
    assert {p.dtype for p in plain.parameters()} == {torch.float32}
    assert not plain.is_gradient_checkpointing
    assert isinstance(load_critic(model_cfg(tiny_model_path)), ValueModel)


def test_unknown_dtype_lists_the_valid_ones(tiny_model_path):
    valid = "choose one of: float32, bfloat16, float16, auto"
    with pytest.raises(ModelLoadError, match=f"model.dtype='fp8' is not valid; {valid}"):
        load_actor(model_cfg(tiny_model_path, dtype="fp8"))


def test_build_if_missing_builds_once_then_reuses(tmp_path):
    cfg = model_cfg(tmp_path / "tiny", build_if_missing=True, tiny={"seed": 3, "vocab_size": 600})
    tokenizer = load_tokenizer(cfg)
    assert len(tokenizer) == 600
    weights = tmp_path / "tiny" / "model.safetensors"
    built_at = weights.stat().st_mtime_ns
    assert load_actor(cfg).config.vocab_size == 600
    assert weights.stat().st_mtime_ns == built_at


def test_tiny_model_built_with_other_settings_is_refused(tmp_path):
    load_tokenizer(model_cfg(tmp_path / "tiny", build_if_missing=True, tiny={"vocab_size": 600, "num_heads": 4}))
    changed = model_cfg(tmp_path / "tiny", build_if_missing=True, tiny={"vocab_size": 600, "num_heads": 2})
    with pytest.raises(ModelLoadError, match=r"built with other settings \(num_heads=4 \(config: 2\)\): delete"):
        load_actor(changed)


@pytest.mark.parametrize("setting,value", [("seed", 5), ("vocab_size", 700)])
def test_tiny_model_built_with_another_seed_or_vocabulary_is_refused(tmp_path, setting, value):
    """Neither shows in the model's config.json (the vocabulary is the BPE's upper bound): the build records them."""
    built = {"vocab_size": 600, "seed": 0}
    model_source(model_cfg(tmp_path / "tiny", build_if_missing=True, tiny=built))
    changed = model_cfg(tmp_path / "tiny", build_if_missing=True, tiny={**built, setting: value})
    with pytest.raises(ModelLoadError, match=rf"built with other settings \({setting}={built[setting]} \(config: {value}\)\)"):
        model_source(changed)


@pytest.mark.parametrize("missing", ["/no/such/model_dir", "./no_such_dir/model", "../no_such_dir", "~/no_such_dir_x"])
def test_missing_local_path_names_the_fix(missing):
    with pytest.raises(ModelLoadError) as error:
        load_actor(model_cfg(missing))
    assert str(error.value) == (
        f"model path '{missing}' does not exist: set model.name_or_path to a model directory or a hub id"
    )
    assert isinstance(error.value, UserError)  # train.py prints it as one line


def test_path_under_an_existing_directory_is_local_and_org_name_is_a_hub_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    with pytest.raises(ModelLoadError, match="model path 'data/tiny_modle' does not exist"):
        model_source(model_cfg("data/tiny_modle"))
    assert model_source(model_cfg("Qwen/Qwen2.5-7B-Instruct")) == ("Qwen/Qwen2.5-7B-Instruct", False)


def test_directory_without_a_model_names_the_fix(tmp_path):
    with pytest.raises(ModelLoadError, match="holds no model \\(no config.json\\)"):
        load_tokenizer(model_cfg(tmp_path))


def test_pickled_weights_are_refused(tiny_model_path, tmp_path):
    copy = Path(shutil.copytree(tiny_model_path, tmp_path / "pickled"))
    torch.save(load_file(copy / "model.safetensors"), copy / "pytorch_model.bin")
    (copy / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="weights as safetensors"):
        load_actor(model_cfg(copy))


def test_unavailable_hub_id_says_how_to_download_it(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read once at import
    name = "lightning-epo-tests/no-such-model"
    for load in (load_tokenizer, load_actor):
        with pytest.raises(ModelLoadError) as error:
            load(model_cfg(name))
        message = str(error.value)
        assert f"hub model '{name}'" in message
        assert f"huggingface-cli download {name} --local-dir DIR" in message
        assert "model.name_or_path=DIR" in message and "HF_HOME" in message
        assert "\n" not in message


def test_token_and_revision_reach_from_pretrained_for_hub_ids_only(tiny_model_path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # "org" is no local directory
    calls = []
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda source, **kwargs: calls.append(kwargs))
    load_actor(model_cfg("org/model", token="hf_secret", revision="v1"))
    load_actor(model_cfg(tiny_model_path, token="hf_secret", revision="v1"))
    assert (calls[0]["token"], calls[0]["revision"]) == ("hf_secret", "v1")
    assert "token" not in calls[1] and "revision" not in calls[1]
