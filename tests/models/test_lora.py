"""``model.lora``: only the adapters train, the KL reference is the adapter-free base, engines and exports get
the merged weights."""

from __future__ import annotations

import hydra
import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM

from lightning_epo.core.errors import ConfigError, UserError
from lightning_epo.models.loading import load_actor, load_critic, load_tokenizer
from lightning_epo.models.lora import adapter_parameters, is_lora
from lightning_epo.models.policy_outputs import actor_token_outputs
from lightning_epo.models.shared_prefix import Sharing
from lightning_epo.models.weights import gathered_copy, hf_weights
from lightning_epo.rollout.engine import SamplingParams
from lightning_epo.rollout.hf_engine import HFEngine
from lightning_epo.runtime.config import validate
from tests.training.test_module import fit_one_step, params, synthetic_batch

LORA = ("model.lora.r=4", "optim.optimizer.weight_decay=0.0", "optim.actor_lr=1e-2", "optim.warmup_ratio=0")


def lora_cfg(tiny_model_path: str, **lora):
    return OmegaConf.create({"name_or_path": tiny_model_path, "dtype": "float32", "lora": {
        "r": 4, "alpha": 8, "dropout": 0.0, "target_modules": "all-linear", "critic": False, **lora}})


def trained_adapters(actor) -> None:
    """Give every adapter non-zero weights (as training would: PEFT starts ``B`` at zero, a no-op adapter)."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in adapter_parameters(actor):
            param.copy_(torch.randn(param.shape, generator=generator) * 0.3)


def response_batch(vocab: int):
    return synthetic_batch(vocab, seed=1)


def logprobs(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return actor_token_outputs(model, batch.input_ids, batch.attention_mask, batch.response_mask)[0]


def test_only_the_adapters_train_and_the_optimizer_holds_nothing_else(compose_cfg):
    cfg = compose_cfg("algo=ppo_epo", "model.lora.critic=true", *LORA)
    module = hydra.utils.instantiate(cfg.module)
    module.configure_model()
    before = params(module)
    trained, trainer = fit_one_step(cfg, [synthetic_batch(module.actor.config.vocab_size)])
    after = params(trained)
    # identity is the point: a frozen parameter is never written, so it keeps its loaded bits exactly
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    adapters = {n for n in before if "lora_" in n}
    assert adapters and changed - adapters == {"critic.head.weight", "critic.head.bias"}  # the value head trains in full
    assert {n for n in adapters if "lora_B" in n} <= changed  # B starts at zero: the first step moves it
    optimized = {id(p) for group in trainer.optimizers[0].param_groups for p in group["params"]}
    trainable = {id(p) for p in trained.parameters() if p.requires_grad}
    assert optimized == trainable
    assert {id(p) for p in adapter_parameters(trained.actor)} <= trainable


def test_the_critic_trains_in_full_unless_lora_critic(tiny_model_path):
    critic = load_critic(lora_cfg(tiny_model_path, critic=False))
    assert not is_lora(critic.backbone) and all(p.requires_grad for p in critic.parameters())
    critic = load_critic(lora_cfg(tiny_model_path, critic=True))
    assert is_lora(critic.backbone) and critic.head.weight.requires_grad


def test_without_lora_the_kl_reference_is_a_frozen_copy(compose_cfg, tiny_model_path):
    module = hydra.utils.instantiate(compose_cfg("algo=ppo_epo", "algo.kl_coef=0.1").module)
    module.configure_model()
    assert not module.reference.training and not any(p.requires_grad for p in module.reference.parameters())
    batch = response_batch(module.actor.config.vocab_size)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    torch.testing.assert_close(module._reference_logprobs(batch, Sharing()), logprobs(base, batch), atol=1e-5, rtol=0)


def test_the_kl_reference_is_the_base_model_with_the_adapter_disabled(compose_cfg, tiny_model_path):
    module = hydra.utils.instantiate(compose_cfg("algo=ppo_epo", "algo.kl_coef=0.1", *LORA).module)
    module.configure_model()
    assert module.reference is None  # no second copy of the base
    trained_adapters(module.actor)
    batch = response_batch(module.actor.config.vocab_size)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    with torch.no_grad():
        reference = module._reference_logprobs(batch, Sharing())
    torch.testing.assert_close(reference, logprobs(base, batch), atol=1e-5, rtol=0)
    assert not torch.allclose(logprobs(module.actor, batch), reference, atol=1e-3)  # the adapter is back on after


def test_merged_weights_are_the_adapted_model_under_the_base_names_and_leave_it_unchanged(tiny_model_path):
    actor = load_actor(lora_cfg(tiny_model_path))
    trained_adapters(actor)
    state = {n: p.clone() for n, p in actor.state_dict().items()}
    merged = dict(hf_weights(actor))
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    assert merged.keys() == dict(plain.named_parameters()).keys()
    plain.load_state_dict(merged, strict=False)
    batch = response_batch(plain.config.vocab_size)
    # W x + B A x and (W + B A) x round differently in float32: (float64: 2e-6)
    torch.testing.assert_close(logprobs(plain, batch), logprobs(actor, batch), atol=1e-5, rtol=1e-4)
    assert all(torch.equal(state[n], p) for n, p in actor.state_dict().items())  # merged on the side: not written


def test_the_hf_engine_samples_from_the_adapted_weights(tiny_model_path):
    actor = load_actor(lora_cfg(tiny_model_path))
    trained_adapters(actor)
    tokenizer = load_tokenizer(OmegaConf.create({"name_or_path": tiny_model_path}))
    engine = HFEngine(tokenizer)
    engine.sync_weights(actor)
    prompts = [tokenizer.encode(t, add_special_tokens=False) for t in ("go north", "look around you and")]
    torch.manual_seed(0)
    for prompt, generation in zip(prompts, engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=8))):
        ids = torch.tensor([prompt + generation.token_ids])
        mask = torch.zeros_like(ids)
        mask[0, len(prompt):] = 1
        with torch.no_grad():
            trainer_logprobs = actor_token_outputs(actor, ids, torch.ones_like(ids), mask)[0][0, len(prompt):]
        torch.testing.assert_close(torch.tensor(generation.logprobs), trainer_logprobs, atol=1e-5, rtol=0)


def test_target_modules_that_match_nothing_fail_with_one_line(tiny_model_path):
    with pytest.raises(UserError, match=r"^model.lora.target_modules=\['nope'\] does not fit this model"):
        load_actor(lora_cfg(tiny_model_path, target_modules=["nope"]))


def test_a_plain_copy_for_zero3_sampling_holds_the_merged_weights(tiny_model_path):
    """Under ZeRO-3 the hf engine samples from ``gathered_copy(actor)``: for a LoRA actor, the merged base model."""
    actor = load_actor(lora_cfg(tiny_model_path))
    trained_adapters(actor)
    copy = gathered_copy(actor)
    assert not is_lora(copy)
    batch = response_batch(copy.config.vocab_size)
    torch.testing.assert_close(logprobs(copy, batch), logprobs(actor, batch), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("overrides", [("algo=grpo_epo", "model.lora.r=8"), ("algo=ppo_epo",)])
def test_lora_critic_without_adapters_or_a_critic_is_refused(compose_cfg, overrides):
    with pytest.raises(ConfigError, match=r"^model.lora.critic=true does nothing without model.lora.r and a critic"):
        validate(compose_cfg(*overrides, "model.lora.critic=true"))
    validate(compose_cfg("algo=ppo_epo", "model.lora.r=8", "model.lora.critic=true"))


def test_a_lora_rank_below_one_is_refused_at_start(compose_cfg):
    with pytest.raises(ConfigError, match=r"^model.lora.r must be an integer >= 1 or null, got 0"):
        validate(compose_cfg("model.lora.r=0"))


def _layer_outputs_need_grad(model, layers) -> list[bool]:
    """Whether each decoder layer's output carries a gradient (autograd recorded it) in one forward of ``model``."""
    needs = []
    hooks = [layer.register_forward_hook(lambda _m, _i, out: needs.append(
        (out[0] if isinstance(out, tuple) else out).requires_grad)) for layer in layers]
    model(input_ids=torch.tensor([[5, 6, 7, 8]]))
    for hook in hooks:
        hook.remove()
    return needs


def test_top_layers_adapts_only_the_top_decoder_layers_and_the_backward_stops_below_them(tiny_model_path):
    whole = load_actor(lora_cfg(tiny_model_path))
    layers = whole.config.num_hidden_layers
    assert layers >= 2 and _layer_outputs_need_grad(whole, whole.get_base_model().model.layers) == [True] * layers
    actor = load_actor(lora_cfg(tiny_model_path, top_layers=1))
    adapted = {name.split(".layers.")[1].split(".")[0] for name, _ in actor.named_parameters() if "lora_" in name}
    assert adapted == {str(layers - 1)}
    assert _layer_outputs_need_grad(actor, actor.get_base_model().model.layers) == [False] * (layers - 1) + [True]
    critic = load_critic(OmegaConf.merge(lora_cfg(tiny_model_path, critic=True, top_layers=1), {"critic_layers": 1}))
    assert {n.split(".layers.")[1].split(".")[0] for n, _ in critic.named_parameters() if "lora_" in n} == {"0"}


def test_top_layers_beyond_the_model_fail_with_one_line(tiny_model_path):
    with pytest.raises(UserError, match=r"^model.lora.top_layers=3: the model has 2 decoder layers; give a number from 1"):
        load_actor(lora_cfg(tiny_model_path, top_layers=3))


def test_top_layers_without_adapters_is_refused_at_start(compose_cfg):
    with pytest.raises(ConfigError, match=r"^model.lora.top_layers=1 does nothing without model.lora.r"):
        validate(compose_cfg("model.lora.top_layers=1"))
    with pytest.raises(ConfigError, match=r"^model.lora.top_layers must be an integer >= 1 or null, got 0"):
        validate(compose_cfg("model.lora.r=8", "model.lora.top_layers=0"))
    validate(compose_cfg("model.lora.r=8", "model.lora.top_layers=1"))
