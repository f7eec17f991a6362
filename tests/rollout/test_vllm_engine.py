"""The vLLM engine's logic that needs no vLLM: weights in checkpoint naming (ZeRO-3 gathered one by one),
the sleep / wake / push / reset order, and output conversion, against a fake ``vllm`` module."""

from __future__ import annotations

import importlib.util
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open

import lightning_epo.rollout.vllm_engine as vllm_engine
from lightning_epo.core.errors import UserError
from lightning_epo.models.weights import hf_weights
from lightning_epo.rollout.engine import SamplingParams
from lightning_epo.rollout.vllm_engine import VLLMEngine, to_generation
from tests.rollout.fake_vllm import completion, fake_platform, fake_vllm_module


@pytest.fixture(scope="module")
def tiny_actor(tiny_model_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_path)


def test_weights_carry_the_checkpoint_names_and_values(tiny_actor, tiny_model_path):
    """The names vLLM's ``load_weights`` reads are the checkpoint's (``save_pretrained``) names."""
    with safe_open(str(Path(tiny_model_path) / "model.safetensors"), "pt") as f:
        saved = {name: f.get_tensor(name) for name in f.keys()}
    pushed = dict(hf_weights(tiny_actor, torch.bfloat16))
    assert pushed.keys() == saved.keys()
    for name, tensor in pushed.items():
        assert tensor.dtype == torch.bfloat16
        torch.testing.assert_close(tensor, saved[name].to(torch.bfloat16), msg=name)
        assert tensor.data_ptr() != dict(tiny_actor.named_parameters())[name].data_ptr()  # a copy, not a view


def test_zero3_shards_are_gathered_one_at_a_time_and_copied_while_gathered(monkeypatch):
    """Fake ZeRO-3: a parameter holds an empty shard except inside GatheredParameters."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    full = {id(p): p.detach().clone() for p in model.parameters()}
    for p in model.parameters():
        p.ds_id = id(p)
        p.data = torch.empty(0)
    events = []

    @contextmanager
    def gathered(params, modifier_rank=None):
        (param,) = params
        assert modifier_rank is None  # read-only gather
        assert not any(e[0] == "open" for e in events[-1:])  # never two parameters gathered at once
        param.data = full[param.ds_id].clone()
        events.append(("open", param.ds_id))
        yield
        param.data = torch.empty(0)
        events.append(("close", param.ds_id))

    monkeypatch.setitem(sys.modules, "deepspeed", SimpleNamespace(zero=SimpleNamespace(GatheredParameters=gathered)))
    pushed = list(hf_weights(model))
    assert [name for name, _ in pushed] == ["0.weight", "0.bias", "1.weight", "1.bias"]
    for (_, tensor), p in zip(pushed, model.parameters()):
        torch.testing.assert_close(tensor, full[id(p)])  # intact after the shard was released
    assert [kind for kind, _ in events] == ["open", "close"] * 4


@pytest.fixture
def fake_vllm(monkeypatch):
    """A fake ``vllm`` module on a CUDA platform (``module.platforms.current_platform`` can be swapped)."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    module = fake_vllm_module()
    monkeypatch.setattr(vllm_engine, "import_vllm", lambda: module)
    return module


def make_engine(tiny_model_path, **kwargs) -> VLLMEngine:
    tokenizer = SimpleNamespace(eos_token_id=2)
    return VLLMEngine(tokenizer, {"name_or_path": tiny_model_path}, **kwargs)


def test_engine_asks_vllm_for_processed_logprobs_in_process(fake_vllm, tiny_model_path):
    engine = make_engine(tiny_model_path, gpu_memory_utilization=0.3, llm_kwargs={"max_model_len": 512})
    kwargs = engine.llm.kwargs
    assert kwargs["logprobs_mode"] == "processed_logprobs"  # log_softmax(logits / T), as the trainer
    assert kwargs["generation_config"] == "vllm"  # no checkpoint sampling defaults
    assert kwargs["skip_tokenizer_init"] and kwargs["enable_sleep_mode"]
    assert (kwargs["gpu_memory_utilization"], kwargs["max_model_len"]) == (0.3, 512)
    assert "kv_cache_memory_bytes" not in kwargs  # on GPU gpu_memory_utilization sizes the KV cache
    assert vllm_engine.os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


def test_on_cpu_sleep_mode_is_off_and_the_kv_cache_has_a_fixed_size(fake_vllm, tiny_model_path, caplog):
    """vLLM refuses to start with sleep mode on CPU, and there reads gpu_memory_utilization as a share of RAM."""
    fake_vllm.platforms.current_platform = fake_platform("cpu")
    with caplog.at_level("INFO", logger=vllm_engine.__name__):
        engine = make_engine(tiny_model_path)
    assert engine.llm.kwargs["enable_sleep_mode"] is False and not engine.sleep_mode
    assert [r.getMessage() for r in caplog.records] == [
        "vLLM sleep mode is off: vLLM has it on CUDA only, and this engine runs on cpu"
    ]
    assert engine.llm.kwargs["kv_cache_memory_bytes"] == vllm_engine.CPU_KV_CACHE_GIB * 2**30
    engine.release_memory()  # nothing to free: no sleep call
    assert engine.llm.calls == []
    assert make_engine(tiny_model_path, kv_cache_gib=0.25).llm.kwargs["kv_cache_memory_bytes"] == 2**28


def test_on_cpu_vllm_compiles_without_its_aot_cache_unless_the_user_chose(fake_vllm, tiny_model_path, monkeypatch):
    """vLLM's AOT-compiled artifact never loads on CPU (vllm-project/vllm#45447: every start compiled again, 87-100 s
    for SmolLM2); without it, torch's inductor cache serves every start after the first. GPU keeps vLLM's default."""
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "")  # recorded, so the variable the engine sets is undone after
    monkeypatch.delenv("VLLM_USE_AOT_COMPILE")
    make_engine(tiny_model_path)  # CUDA
    assert "VLLM_USE_AOT_COMPILE" not in vllm_engine.os.environ
    fake_vllm.platforms.current_platform = fake_platform("cpu")
    make_engine(tiny_model_path)
    assert vllm_engine.os.environ["VLLM_USE_AOT_COMPILE"] == "0"
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "1")
    make_engine(tiny_model_path)
    assert vllm_engine.os.environ["VLLM_USE_AOT_COMPILE"] == "1"


def test_on_cpu_kv_blocks_are_small_enough_to_cache_a_shared_prompt_prefix(fake_vllm, tiny_model_path):
    """Prefix caching reuses whole KV blocks only, and vLLM's CPU default of 128 tokens a block cached none of
    SmolLM2's gridworld prompts (156 tokens, 65 shared). GPU keeps vLLM's own block size; a user's is kept."""
    assert "block_size" not in make_engine(tiny_model_path).llm.kwargs  # CUDA
    fake_vllm.platforms.current_platform = fake_platform("cpu")
    assert make_engine(tiny_model_path).llm.kwargs["block_size"] == vllm_engine.CPU_BLOCK_SIZE == 32
    assert make_engine(tiny_model_path, block_size=128).llm.kwargs["block_size"] == 128
    assert make_engine(tiny_model_path, llm_kwargs={"block_size": 64}).llm.kwargs["block_size"] == 64


def test_sleep_wake_push_reset_order_over_two_rl_steps(fake_vllm, tiny_model_path, tiny_actor):
    """The DataModule's calls over two RL steps and an evaluation between them: a push after a level-2 sleep happens
    in ``before_collection`` (every rank calls it), never inside ``generate`` (a rank without episodes never calls
    it, and under ZeRO-3 a push is a collective)."""
    engine = make_engine(tiny_model_path, sleep_level=2)
    llm = engine.llm
    sampling = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=3)
    engine.before_collection()  # nothing pushed yet: nothing to push again
    with pytest.raises(RuntimeError, match="call sync_weights"):
        engine.generate([[1, 2]], sampling)
    engine.sync_weights(tiny_actor)  # fit start
    engine.before_collection()  # rollout k = 0: the weights are valid
    engine.generate([[1, 2]], sampling)
    engine.release_memory()  # the update needs the memory
    engine.sync_weights(tiny_actor)  # after the update
    engine.before_collection()  # evaluation split 1
    engine.generate([[1, 2]], sampling)
    engine.release_memory()  # level 2 discards the weights ...
    with pytest.raises(RuntimeError, match="before_collection"):  # ... which generate never pushes itself
        engine.generate([[1, 2]], sampling)
    engine.before_collection()  # ... so rollout k = 1 pushes the actor again, at its start
    engine.generate([[1, 2]], sampling)
    engine.generate([[1, 2]], sampling)  # the next turn: no wake-up
    push = ["wake_up(weights)", "load_weights", "reset_prefix_cache"]  # weights only: the KV cache stays freed
    assert llm.calls == [
        "load_weights", "reset_prefix_cache", "generate",
        "sleep(2)", *push, "wake_up(kv_cache)", "generate",
        "sleep(2)", *push, "wake_up(kv_cache)", "generate", "generate",
    ]
    names = [n for n, _ in tiny_actor.named_parameters()]
    assert llm.loaded == [names, names, names]


def test_level_1_sleep_keeps_the_weights_usable(fake_vllm, tiny_model_path, tiny_actor):
    engine = make_engine(tiny_model_path, sleep_level=1)
    engine.sync_weights(tiny_actor)
    engine.release_memory()
    engine.generate([[1, 2]], SamplingParams(max_new_tokens=3))
    assert engine.llm.calls[-4:] == ["sleep(1)", "wake_up(weights)", "wake_up(kv_cache)", "generate"]


def test_sampling_params_token_prompts_and_stop_ids(fake_vllm, tiny_model_path, tiny_actor):
    engine = make_engine(tiny_model_path, stop_token_ids=[9])
    engine.sync_weights(tiny_actor)
    out = engine.generate([[1, 2], [3]], SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=3))
    params = engine.llm.last_params
    assert (params.temperature, params.top_p, params.max_tokens, params.logprobs) == (0.7, 0.9, 3, 0)
    assert 9 in params.stop_token_ids and 2 in params.stop_token_ids  # extra + tokenizer eos
    assert params.detokenize is False  # token in, token out
    assert [g.token_ids for g in out] == [[5, 7, 2], [5, 7, 2]]
    assert out[0].logprobs == [-0.5, -1.5, -0.1] and out[0].finish_reason == "stop"
    assert [g.cached_prompt_tokens for g in out] == [1, 1]  # each request's num_cached_tokens


def test_to_generation_reads_the_sampled_tokens_logprob_and_rejects_aborts():
    generation = to_generation(completion([4, 8], [-0.25, -2.0], "length"))
    assert (generation.token_ids, generation.logprobs, generation.finish_reason) == ([4, 8], [-0.25, -2.0], "length")
    with pytest.raises(RuntimeError, match="'abort'"):
        to_generation(completion([4], [-0.1], "abort"))


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_missing_vllm_names_the_install_command(tiny_model_path):
    with pytest.raises(UserError, match="make setup-vllm"):
        make_engine(tiny_model_path)


# --- vLLM itself (marked vllm: .venv-vllm/bin/python -m pytest -m vllm; on CPU here, CUDA where there is one)

TOL = 1e-5  # float32: both stacks run the same arithmetic up to summation order


@pytest.fixture(scope="module")
def untied_model_path(tiny_model_path, tmp_path_factory):
    """The tiny model with an output layer of its own (``tie_word_embeddings=false``, like Qwen2.5-7B)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    model.config.tie_word_embeddings = False
    untied = type(model)(model.config)
    untied.load_state_dict(model.state_dict(), strict=False)  # the checkpoint has no lm_head.weight
    with torch.no_grad():
        untied.lm_head.weight.copy_(model.lm_head.weight.flip(0))  # not the embedding
    assert untied.lm_head.weight.data_ptr() != untied.get_input_embeddings().weight.data_ptr()
    path = tmp_path_factory.mktemp("models") / "tiny_untied"
    untied.save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_model_path).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module", params=["tied", "untied"])
def vllm_setup(request, vllm_env, tiny_model_path, untied_model_path):
    """One float32 engine per model on this module's tests (a small KV cache), the trainer's actor and tokenizer."""
    from lightning_epo.models.loading import load_actor, load_tokenizer

    cfg = {"name_or_path": tiny_model_path if request.param == "tied" else untied_model_path, "dtype": "float32"}
    tokenizer, actor = load_tokenizer(cfg), load_actor(cfg).eval()
    assert actor.config.tie_word_embeddings == (request.param == "tied")
    engine = VLLMEngine(tokenizer, cfg, dtype="float32", kv_cache_gib=0.0625)
    yield SimpleNamespace(engine=engine, actor=actor, tokenizer=tokenizer, cfg=cfg)
    engine.close()


@pytest.mark.vllm
def test_vllm_logprobs_equal_the_trainers_after_a_push(vllm_setup):
    """After an update and a push, vLLM's log-prob of each token it sampled is the trainer's (tied and untied
    output layers: a tied one is not reloaded by vLLM and stayed about 1e-2 off)."""
    from benchmarks.vllm_logprob_check import PROMPTS, logprob_diffs, perturb_, sample_and_compare
    from lightning_epo.models.loading import load_actor

    engine, actor = vllm_setup.engine, vllm_setup.actor
    torch.manual_seed(0)  # vLLM samples from the process's generator (it runs in this process)
    perturb_(actor, seed=1)
    engine.sync_weights(actor)
    prompt_ids = [vllm_setup.tokenizer(t)["input_ids"] for t in PROMPTS]
    generations, diff = sample_and_compare(engine, actor, prompt_ids, max_new_tokens=24)
    assert diff.numel() > 24 and diff.max() <= TOL, diff.max()  # a response may stop early
    # the push took effect: under the checkpoint's weights the same tokens have other log-probs
    assert logprob_diffs(load_actor(vllm_setup.cfg).eval(), prompt_ids, generations).mean() > 1e-3


@pytest.mark.vllm
def test_vllm_read_the_aot_setting_the_engine_made(vllm_setup):
    """The engine sets ``VLLM_USE_AOT_COMPILE`` before vLLM reads it (vLLM caches its settings once an engine
    starts): on CPU vLLM started with its AOT path off, unless the user set ``VLLM_USE_AOT_COMPILE=1``."""
    import vllm.envs

    if not vllm_setup.engine.vllm.platforms.current_platform.is_cpu():
        pytest.skip("on GPU the engine leaves vLLM's default")
    assert vllm.envs.VLLM_USE_AOT_COMPILE == (os.environ.get("VLLM_USE_AOT_COMPILE") == "1")


@pytest.mark.vllm
def test_prompts_sharing_a_prefix_reuse_its_kv_blocks_and_compute_the_same(vllm_setup):
    """Two prompts whose first 70 tokens are one instruction (as an environment's prompts are): the second
    computes only what the first did not, on CPU as on GPU, and its log-probs are still the trainer's."""
    from benchmarks.vllm_logprob_check import perturb_, sample_and_compare

    engine, actor = vllm_setup.engine, vllm_setup.actor
    torch.manual_seed(0)
    tokens = torch.randint(3, len(vllm_setup.tokenizer), (100,), generator=torch.Generator().manual_seed(1)).tolist()
    first, second = tokens[:90], tokens[:70] + tokens[80:]
    perturb_(actor, seed=4)
    engine.sync_weights(actor)
    engine.generate([first], SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=1))
    block_size = engine.llm.llm_engine.vllm_config.cache_config.block_size
    (output,) = engine.generate([second], SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=1))
    assert block_size <= 70 and output.cached_prompt_tokens == 70 // block_size * block_size, (block_size, output)
    _, diff = sample_and_compare(engine, actor, [second], max_new_tokens=16)
    assert diff.max() <= TOL, diff.max()


@pytest.mark.vllm
def test_prefix_cache_is_reset_after_a_push(vllm_setup):
    """A prompt seen before a push must not reuse its cached KV blocks (computed with the old weights): without
    ``reset_prefix_cache`` the log-probs after the second push are about 0.03 off."""
    from benchmarks.vllm_logprob_check import perturb_, sample_and_compare

    engine, actor = vllm_setup.engine, vllm_setup.actor
    torch.manual_seed(0)
    prompt = torch.randint(3, len(vllm_setup.tokenizer), (300,), generator=torch.Generator().manual_seed(0)).tolist()
    perturb_(actor, seed=2)
    engine.sync_weights(actor)
    sample_and_compare(engine, actor, [prompt], max_new_tokens=2)  # caches the prompt's full KV blocks
    perturb_(actor, seed=3)
    engine.sync_weights(actor)
    _, diff = sample_and_compare(engine, actor, [prompt], max_new_tokens=16)
    assert diff.max() <= TOL, diff.max()
