"""The critic: values of the states before each token, on a backbone of its own."""

from __future__ import annotations

import pytest
import torch

from lightning_epo.core.errors import UserError
from lightning_epo.models.loading import load_actor, load_critic
from tests.models.conftest import L, N


def model_cfg(path, **overrides):
    return {"name_or_path": path, "dtype": "float32", "attn_implementation": "sdpa", **overrides}


@pytest.fixture(scope="module")
def critic(tiny_model_path):
    torch.manual_seed(0)
    return load_critic(model_cfg(tiny_model_path))


@pytest.fixture
def batch(padded_ids):
    return padded_ids


def test_values_are_float32_n_by_l_and_zero_before_the_first_token(critic, batch):
    values = critic(*batch)
    assert values.shape == (N, L) and values.dtype == torch.float32
    assert torch.equal(values[:, 0], torch.zeros(N))
    assert values[:, 1:].abs().min() > 0


@pytest.mark.parametrize("p", [1, 5, L - 1])
def test_value_at_p_depends_only_on_tokens_before_p(critic, batch, p):
    input_ids, attention_mask = batch
    changed = input_ids.clone()
    changed[:, p] = (changed[:, p] + 17) % 1000 + 3
    with torch.no_grad():
        before, after = critic(input_ids, attention_mask), critic(changed, attention_mask)
    # identity is the point: the same weights and shapes take the same kernels, and token p reaches earlier values
    # only through attention weights that are exactly 0, so any bit that moves leaked from token p
    torch.testing.assert_close(after[:, : p + 1], before[:, : p + 1], rtol=0, atol=0)
    if p + 1 < L:
        assert (after[:, p + 1 :] - before[:, p + 1 :]).abs().amax() > 1e-6  # later states do see token p


def test_value_is_the_head_on_the_previous_hidden_state(critic, batch):
    input_ids, attention_mask = batch
    with torch.no_grad():
        hidden = critic.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        expected = critic.head(hidden).squeeze(-1)  # [N, L]: value after reading each token
        torch.testing.assert_close(critic(input_ids, attention_mask)[:, 1:], expected[:, :-1])


def test_backbone_starts_from_the_actor_weights_but_shares_no_tensor(critic, tiny_model_path):
    actor = load_actor(model_cfg(tiny_model_path))
    actor_decoder = dict(actor.get_decoder().named_parameters())
    critic_backbone = dict(critic.backbone.named_parameters())
    assert critic_backbone.keys() == actor_decoder.keys()
    for name, param in critic_backbone.items():
        torch.testing.assert_close(param, actor_decoder[name], rtol=0, atol=0)  # copies of one file: identical
    actor_storage = {p.untyped_storage().data_ptr() for p in actor.parameters()}
    assert not actor_storage & {p.untyped_storage().data_ptr() for p in critic.parameters()}


def test_head_init_is_small_normal_with_zero_bias(critic):
    weight = critic.head.weight
    assert weight.shape == (1, critic.backbone.config.hidden_size) and weight.dtype == torch.float32
    std = critic.backbone.config.initializer_range  # the model's own init scale, as verl's critic head
    assert 0.5 * std < weight.std() < 1.5 * std and weight.abs().max() < 5 * std
    assert torch.equal(critic.head.bias, torch.zeros(1))


def test_every_parameter_gets_a_gradient(tiny_model_path, batch):
    critic = load_critic(model_cfg(tiny_model_path)).train()
    critic(*batch).sum().backward()
    for name, param in critic.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name


def test_gradient_checkpointing_changes_neither_values_nor_gradients(tiny_model_path, batch):
    torch.manual_seed(0)
    plain = load_critic(model_cfg(tiny_model_path)).train()
    torch.manual_seed(0)
    checkpointed = load_critic(model_cfg(tiny_model_path, gradient_checkpointing=True)).train()
    assert checkpointed.backbone.is_gradient_checkpointing and not plain.backbone.is_gradient_checkpointing
    values_plain, values_ckpt = plain(*batch), checkpointed(*batch)
    torch.testing.assert_close(values_ckpt, values_plain)
    values_plain.pow(2).sum().backward()
    values_ckpt.pow(2).sum().backward()
    grads_plain = {n: p.grad for n, p in plain.named_parameters()}
    for name, param in checkpointed.named_parameters():
        torch.testing.assert_close(param.grad, grads_plain[name], msg=name)


def test_values_stay_float32_on_a_bfloat16_backbone(tiny_model_path, batch):
    critic = load_critic(model_cfg(tiny_model_path, dtype="bfloat16"))
    assert critic.backbone.dtype == torch.bfloat16
    assert critic(*batch).dtype == torch.float32


def test_a_bfloat16_head_still_computes_in_float32(tiny_model_path, batch):
    """DeepSpeed bf16 casts every parameter to bf16, the head included: its product is still float32."""
    critic = load_critic(model_cfg(tiny_model_path))
    critic.head.to(torch.bfloat16)
    input_ids, attention_mask = batch
    with torch.no_grad():
        hidden = critic.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state.double()
        expected = (hidden @ critic.head.weight.double().T + critic.head.bias.double()).squeeze(-1)  # [N, L]
        values = critic(input_ids, attention_mask)
    assert values.dtype == torch.float32
    torch.testing.assert_close(values[:, 1:].double(), expected[:, :-1], rtol=1e-5, atol=1e-6)


def test_head_init_does_not_depend_on_what_loading_drew_from_the_global_generator(tiny_model_path):
    """ZeRO-3's loading draws other random numbers than a plain load: the head must not follow them."""
    torch.manual_seed(0)
    plain = load_critic(model_cfg(tiny_model_path))
    torch.manual_seed(0)
    torch.rand(100)
    drawn = load_critic(model_cfg(tiny_model_path))
    assert torch.equal(plain.head.weight, drawn.head.weight)  # one seed, one draw: identity is the point


class _GeneratorOnItsDevice(torch.overrides.TorchFunctionMode):
    """CUDA's rule, enforced on any device: a random fill takes a generator of its tensor's own device (on a GPU,
    Lightning builds the models with CUDA as the default device, and a CPU generator cannot fill a CUDA tensor)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        generator, tensor = kwargs.get("generator"), args[0] if args else kwargs.get("tensor")
        if generator is not None and isinstance(tensor, torch.Tensor) and tensor.device.type != generator.device.type:
            raise RuntimeError(f"Expected a '{tensor.device.type}' device type for generator")
        return func(*args, **kwargs)


def test_the_head_initialises_when_the_default_device_is_not_the_generators(tiny_model_path):
    """The GPU run builds the critic under a CUDA default device (gpu-check, 2026-11-25: every trainer=gpu case
    died here). The meta device stands in for CUDA, the mode above for CUDA's check; the head drawn off-device is
    the one drawn on the CPU."""
    from lightning_epo.models.critic import ValueModel

    torch.manual_seed(0)
    on_cpu = load_critic(model_cfg(tiny_model_path))
    backbone = on_cpu.backbone.to("meta")
    torch.manual_seed(0)
    with _GeneratorOnItsDevice(), torch.device("meta"):
        off_device = ValueModel(backbone)
    assert off_device.head.weight.device.type == "meta"
    torch.manual_seed(0)  # one seed, one draw: identity is the point
    assert torch.equal(ValueModel(load_critic(model_cfg(tiny_model_path)).backbone).head.weight, on_cpu.head.weight)


def test_values_are_float32_under_bf16_autocast(critic, batch):
    """trainer.precision=bf16-mixed runs the old-policy pass under autocast, which cast the head's product to bf16
    (the pass stores it in float32 buffers: every bf16-mixed run died at its first step, 2026-11-25)."""
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        values = critic(*batch)
    assert values.dtype == torch.float32


def test_a_smaller_critic_reads_the_models_first_layers_through_its_final_norm(tiny_model_path, batch):
    """``model.critic_layers=1``: the backbone is the model's first decoder layer and its final norm, the same
    weights and the same hidden states as the whole model's after that layer, normed."""
    from transformers import AutoModel

    input_ids, attention_mask = batch
    small = load_critic(model_cfg(tiny_model_path, critic_layers=1))
    whole = AutoModel.from_pretrained(tiny_model_path, dtype=torch.float32, attn_implementation="sdpa")
    assert len(small.backbone.layers) == 1 == small.backbone.config.num_hidden_layers < whole.config.num_hidden_layers
    with torch.no_grad():
        hidden = small.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        after_first = whole(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True).hidden_states[1]
        torch.testing.assert_close(hidden, whole.norm(after_first))
    with pytest.raises(UserError, match="model.critic_layers=3: the model has 2 decoder layers"):
        load_critic(model_cfg(tiny_model_path, critic_layers=3))
