"""What is knowable at start is checked at start: the settings that used to fail late, with a traceback
or not at all, are refused (or warned about) by runtime/config.py's checks in one line naming the key and the fix."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from lightning_epo.core.errors import ConfigError, UserError
from lightning_epo.models import loading
from lightning_epo.runtime import config
from lightning_epo.runtime.config import check_machine, check_prompt_room, validate


def test_flash_attention_without_its_package_is_refused(compose_cfg, monkeypatch):
    monkeypatch.setattr(config, "_on_cpu", lambda trainer: False)
    monkeypatch.setattr(config.importlib.util, "find_spec", lambda name: None if name == "flash_attn" else object())
    with pytest.raises(UserError, match=r"model.attn_implementation=flash_attention_2 needs the flash_attn package: "
                                        r".*or set model.attn_implementation=sdpa"):
        check_machine(compose_cfg("model.attn_implementation=flash_attention_2"))
    monkeypatch.setattr(config.importlib.util, "find_spec", lambda name: object())
    check_machine(compose_cfg("model.attn_implementation=flash_attention_2"))


def test_flash_attention_on_cpu_is_refused(compose_cfg):
    with pytest.raises(UserError, match="model.attn_implementation=flash_attention_2 needs a CUDA GPU"):
        check_machine(compose_cfg("model.attn_implementation=flash_attention_2"))


def test_a_kv_block_size_vllm_refuses_on_cpu_is_refused_at_start(compose_cfg, monkeypatch):
    """vLLM's CPU attention takes KV blocks of a multiple of 32 tokens and said so only as its engine started, in a
    real-model recipe after the whole warm start. A GPU's vLLM takes 16."""
    monkeypatch.setattr(config, "vllm_installed", lambda: True)
    monkeypatch.setattr(config.torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"^rollout.engine.block_size=16: vLLM on CPU takes multiples of 32 .*"
                                          r"rollout.engine.block_size=32"):
        check_machine(compose_cfg("rollout=vllm", "rollout.engine.block_size=16"))
    check_machine(compose_cfg("rollout=vllm", "rollout.engine.block_size=64"))
    check_machine(compose_cfg("rollout=vllm"))  # null: the engine's 32
    monkeypatch.setattr(config.torch.cuda, "is_available", lambda: True)
    check_machine(compose_cfg("rollout=vllm", "rollout.engine.block_size=16", "trainer=cpu"))


def test_a_vllm_parallel_group_in_an_evaluation_engine_is_refused(compose_cfg):
    """Each rank's engine gets that rank's prompts and seed; a parallel group of vLLM's needs the same on every
    member. The evaluation engine of a supervised stage is checked as the training engine is."""
    vllm_evaluation = ["experiment=gridworld_sft", "data.val_engine._target_=lightning_epo.rollout.vllm_engine.VLLMEngine"]
    with pytest.raises(ConfigError, match=r"^data.val_engine.llm_kwargs.data_parallel_size=2: each trainer rank "):
        validate(compose_cfg(*vllm_evaluation, "+data.val_engine.llm_kwargs={data_parallel_size: 2}"))
    validate(compose_cfg(*vllm_evaluation, "+data.val_engine.llm_kwargs={tensor_parallel_size: 1}"))
    validate(compose_cfg("experiment=gridworld_sft", "+data.val_engine.llm_kwargs={tensor_parallel_size: 2}"))  # hf


def test_an_evaluation_split_listed_twice_is_refused(compose_cfg):
    with pytest.raises(ConfigError, match=r"env.eval_splits lists iid twice: .*env.eval_splits=\[iid\]"):
        validate(compose_cfg("env.eval_splits=[iid,iid]"))


@pytest.mark.parametrize("precision", ["banana", "17", "true"])
def test_an_unknown_precision_names_the_key_and_the_valid_values(compose_cfg, precision):
    with pytest.raises(ConfigError, match=rf"(?i)trainer.precision='?{precision}'? is not valid; choose one of: .*32-true"):
        validate(compose_cfg(f"trainer.precision={precision}"))
    for valid in ("32", "32-true", "bf16-mixed", "16-mixed"):
        validate(compose_cfg(f"trainer.precision={valid}"))


@pytest.fixture
def no_wandb_login(monkeypatch, tmp_path):
    """No W&B credentials: no key in the environment, an empty netrc, no forced mode."""
    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    monkeypatch.setenv("HOME", str(tmp_path))


def test_online_wandb_without_a_login_is_refused(compose_cfg, no_wandb_login, monkeypatch):
    online = compose_cfg("logger=wandb", "logger.offline=false")
    with pytest.raises(UserError, match=r"logger.offline=false needs a W&B login: run `wandb login` "
                                        r"\(or set WANDB_API_KEY\), or keep logger.offline=true"):
        check_machine(online)
    check_machine(compose_cfg("logger=wandb"))  # offline, the default
    monkeypatch.setenv("WANDB_MODE", "disabled")
    check_machine(online)
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    check_machine(online)


def test_float16_on_cpu_is_refused_with_the_reason(compose_cfg):
    with pytest.raises(UserError, match=r"model.dtype=float16 cannot train on CPU .*: use model.dtype=float32 or bfloat16"):
        check_machine(compose_cfg("model.dtype=float16"))
    check_machine(compose_cfg("model.dtype=bfloat16"))
    check_machine(compose_cfg("model.dtype=float16", "mode=eval"))  # evaluating in float16 is slow, not wrong


@pytest.fixture
def empty_hub_cache(monkeypatch, tmp_path):
    monkeypatch.setattr(loading.hub_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))


def test_an_uncached_hub_id_without_network_fails_at_once(compose_cfg, empty_hub_cache, monkeypatch):
    monkeypatch.setattr(loading.hub_constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens on port 9
    with pytest.raises(UserError, match=r"model.name_or_path=Qwen/Qwen2.5-3B-Instruct is not in the Hugging Face cache "
                                        r"and http://127.0.0.1:9 cannot be reached .*huggingface-cli download"):
        check_machine(compose_cfg("model=qwen2.5-3b", "model.name_or_path=Qwen/Qwen2.5-3B-Instruct"))


def test_a_hub_that_does_not_answer_is_given_up_on_after_the_probe_timeout(monkeypatch):
    """A name lookup that hangs (socket timeouts do not cover it) is left behind after the probe's timeout."""
    released = threading.Event()

    def hang(*args, **kwargs):
        released.wait(5)
        raise OSError("released by the test")  # the probe left behind ends quietly once the test is done

    monkeypatch.setattr(loading, "HUB_PROBE_TIMEOUT_S", 0.1)
    monkeypatch.setattr(loading.socket, "create_connection", hang)
    start = time.monotonic()
    try:
        assert loading._unreachable("https://huggingface.co") == "no answer within 0.1 s"
        assert time.monotonic() - start < 1
    finally:
        released.set()


def test_an_uncached_hub_id_in_offline_mode_fails_at_once(compose_cfg, empty_hub_cache, monkeypatch):
    monkeypatch.setattr(loading.hub_constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(UserError, match=r"is not in the Hugging Face cache and HF_HUB_OFFLINE is set"):
        check_machine(compose_cfg("model=qwen2.5-3b", "model.name_or_path=Qwen/Qwen2.5-3B-Instruct"))


def test_a_cached_hub_id_needs_no_network(compose_cfg, monkeypatch):
    monkeypatch.setattr(loading, "try_to_load_from_cache", lambda repo_id, filename, revision=None: "/cache/config.json")
    monkeypatch.setattr(loading.hub_constants, "HF_HUB_OFFLINE", True)
    check_machine(compose_cfg("model=qwen2.5-3b", "model.name_or_path=Qwen/Qwen2.5-3B-Instruct"))


def test_grpo_groups_of_one_are_refused(compose_cfg):
    """Each group's advantage is its return minus the group's mean: with one rollout per group, exactly 0."""
    with pytest.raises(ConfigError, match=r"algo.group_size=1 .* every advantage is 0 .*: set algo.group_size>=2"):
        validate(compose_cfg("algo=grpo", "algo.group_size=1"))
    validate(compose_cfg("algo=sft"))  # the supervised loss needs no advantage


def test_evaluating_less_often_than_the_run_is_long_is_said(compose_cfg, caplog):
    with caplog.at_level(logging.WARNING, logger=config.__name__):
        validate(compose_cfg("total_steps=4", "test_every=5"))
    assert "test_every=5 is above total_steps=4: no evaluation will run during training" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=config.__name__):
        validate(compose_cfg("total_steps=4", "test_every=4"))
    assert "test_every" not in caplog.text


def test_a_prompt_limit_below_the_prompt_template_is_refused(compose_cfg):
    with pytest.raises(ConfigError, match=r"model.max_prompt_tokens=4 cannot hold the prompt's fixed text \(\d+ tokens "
                                          r"for env=gridworld\): raise model.max_prompt_tokens"):
        check_prompt_room(compose_cfg("model.max_prompt_tokens=4"))
    check_prompt_room(compose_cfg())


@pytest.mark.parametrize(("precision", "native", "warned"), [("bf16-mixed", False, True), ("bf16-mixed", True, False),
                                                              ("32-true", False, False)])
def test_bf16_on_a_cpu_that_emulates_it_is_said(compose_cfg, caplog, monkeypatch, precision, native, warned):
    """bf16 matrix products on an AVX2 CPU ran at 0.3-0.7 GFLOP/s against float32's 113-119 (benchmarks/RESULTS.md
    section 6): a run with bf16 there is told so at start."""
    monkeypatch.setattr(config, "cpu_computes_bf16", lambda: native)
    with caplog.at_level(logging.WARNING, logger=config.__name__):
        check_machine(compose_cfg(f"trainer.precision={precision}"))
    assert ("bf16 matrix products are emulated" in caplog.text) == warned
