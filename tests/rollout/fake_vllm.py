"""A stand-in for the ``vllm`` module that records what :class:`~lightning_epo.rollout.vllm_engine.VLLMEngine` asks of
it (sleeps, wakes, weight pushes, prefix-cache resets, generations), for tests of the engine's own logic: the real
engine over a stubbed ``vllm.LLM``. A push runs the engine's reload function on a fake worker, which reads every
pushed weight (under ZeRO-3 each read gathers a shard: a collective every rank must join)."""

from __future__ import annotations

from types import SimpleNamespace


class FakeWorker:
    """vLLM's worker as ``collective_rpc`` hands it over: in-place reload of checkpoint-format weights."""

    def __init__(self, loaded):
        self.loaded = loaded
        self.model_config = SimpleNamespace(hf_text_config=SimpleNamespace(tie_word_embeddings=False))

    def reload_weights(self, weights_iterator, is_checkpoint_format):
        assert is_checkpoint_format  # transformers naming, not vLLM's packed kernel layout
        self.loaded.append([n for n, _ in weights_iterator])


class FakeLLM:
    """Records the engine's calls; ``collective_rpc`` runs the function on a fake worker; its engine core's
    ``shutdown`` is recorded too."""

    def __init__(self, **kwargs):
        self.kwargs, self.calls, self.loaded = kwargs, [], []
        self.worker = FakeWorker(self.loaded)
        self.llm_engine = SimpleNamespace(engine_core=SimpleNamespace(shutdown=lambda: self.calls.append("shutdown")))

    def sleep(self, level):
        self.calls.append(f"sleep({level})")

    def wake_up(self, tags):
        self.calls.append(f"wake_up({','.join(tags)})")

    def collective_rpc(self, method, args=()):
        self.calls.append("load_weights")
        method(self.worker, *args)

    def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")

    def generate(self, requests, sampling_params, use_tqdm):
        self.calls.append("generate")
        self.last_params = sampling_params
        return [  # the prefix cache served each prompt's first token
            SimpleNamespace(outputs=[completion([5, 7, 2], [-0.5, -1.5, -0.1], "stop")], num_cached_tokens=1)
            for _ in requests
        ]


def completion(token_ids, logprobs, finish_reason):
    steps = [{t: SimpleNamespace(logprob=lp)} for t, lp in zip(token_ids, logprobs)]
    return SimpleNamespace(token_ids=token_ids, logprobs=steps, finish_reason=finish_reason)


def fake_platform(device_type):
    return SimpleNamespace(
        device_type=device_type,
        is_cpu=lambda: device_type == "cpu",
        is_sleep_mode_available=lambda: device_type == "cuda",
    )


def fake_vllm_module(llm=FakeLLM, device_type="cuda"):
    """A ``vllm`` module whose ``LLM`` is ``llm``, on a ``device_type`` platform (``cuda``: sleep mode is on)."""
    return SimpleNamespace(
        LLM=llm, SamplingParams=lambda **kw: SimpleNamespace(**kw), TokensPrompt=lambda **kw: dict(kw),
        platforms=SimpleNamespace(current_platform=fake_platform(device_type)),
    )
