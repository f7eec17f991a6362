"""Generation with vLLM colocated with the trainer (``rollout=vllm``; CUDA only, ``requirements-vllm.txt``).

Written against vLLM 0.33.0 (its docs: ``LLM``, ``SamplingParams``, ``TokensPrompt``, sleep mode,
``collective_rpc``); not run in this repository's CI, which has no GPU. Each training rank owns one engine
on its own GPU (tensor parallel size 1), in its own process, so weights pass by reference:

- Token in, token out: prompts go in as ``TokensPrompt(prompt_token_ids=...)``; the engine returns the
  sampled ids and, with ``SamplingParams(logprobs=0)``, each sampled token's log-prob. The engine is
  created with ``logprobs_mode="processed_logprobs"``, so a log-prob is ``log_softmax(logits / T)`` at the
  sampled id, what the trainer recomputes (with ``top_p < 1`` vLLM renormalises over the nucleus, which
  the trainer does not: keep ``top_p = 1`` for training, the default).
- Sampling is exactly ``SamplingParams``: ``generation_config="vllm"`` keeps the checkpoint's defaults
  (Qwen2.5's ``top_k=20``, ``repetition_penalty=1.05``) out; stop ids are the tokenizer's and the
  checkpoint's eos ids plus ``stop_token_ids`` (as the hf engine).
- Weights: after every update :meth:`sync_weights` streams ``(name, tensor)`` pairs in transformers
  naming (what vLLM's ``model.load_weights`` reads) one parameter at a time, gathering ZeRO-3 shards
  (``deepspeed.zero.GatheredParameters``), into the worker through ``llm.collective_rpc``, then resets
  the prefix cache (cached KV blocks belong to the old weights).
- Memory: with ``enable_sleep_mode`` the engine frees its GPU memory between rollouts
  (:meth:`release_memory`, ``llm.sleep``); ``sync_weights`` wakes the weights only (the KV cache stays
  freed while weights load), ``generate`` wakes the KV cache. ``sleep_level=2`` discards the weights
  instead of backing them up in CPU memory, since a full push follows every sleep.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from lightning_epo.distributed import hf_weights
from lightning_epo.errors import UserError
from lightning_epo.models.loading import model_source
from lightning_epo.rollout.engine import Generation, GenerationEngine, SamplingParams, stop_token_ids

VLLM_MISSING = (
    "rollout=vllm needs vLLM, a CUDA-only extra with its own torch: on a CUDA machine run "
    "`pip install -r requirements-vllm.txt` (or use rollout=hf)"
)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def import_vllm() -> Any:
    """The ``vllm`` module, or a :class:`UserError` naming the install command."""
    try:
        import vllm
    except ImportError as exc:
        raise UserError(VLLM_MISSING) from exc
    return vllm


def _load_weights(worker: Any, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
    """Runs inside the vLLM worker (``collective_rpc`` passes the worker first)."""
    worker.model_runner.get_model().load_weights(weights=weights)


def engine_stop_ids(tokenizer: Any, source: str, extra: list[int] | None) -> list[int]:
    """:func:`~lightning_epo.rollout.engine.stop_token_ids` with the eos ids of the checkpoint at ``source``."""
    from transformers import GenerationConfig

    try:
        config_eos = GenerationConfig.from_pretrained(source).eos_token_id
    except OSError:  # no generation_config.json
        config_eos = None
    return stop_token_ids(tokenizer, config_eos, extra)


def to_generation(completion: Any) -> Generation:
    """A vLLM ``CompletionOutput`` (``token_ids``, per-token ``logprobs`` dicts, ``finish_reason``) as a Generation."""
    token_ids = [int(t) for t in completion.token_ids]
    logprobs = [float(step[t].logprob) for step, t in zip(completion.logprobs, token_ids)]
    if completion.finish_reason not in ("stop", "length"):
        raise RuntimeError(f"vLLM finished a response with {completion.finish_reason!r}; expected 'stop' or 'length'")
    return Generation(token_ids, logprobs, completion.finish_reason)


class VLLMEngine(GenerationEngine):
    """A ``vllm.LLM`` on this rank's GPU, fed token ids, refreshed with the actor's weights after every update.

    Args:
        tokenizer: the trainer's tokenizer (for its eos id; vLLM itself never tokenises: ``skip_tokenizer_init``).
        model: the ``model`` config (``name_or_path``, ``trust_remote_code``, ``revision``).
        gpu_memory_utilization: share of the GPU vLLM may take (weights + KV cache) while awake; the rest is
            the trainer's.
        dtype: the engine's weight dtype (``bfloat16`` | ``float16`` | ``float32``).
        enable_sleep_mode, sleep_level: free the engine's memory between rollouts (see the module docstring).
        seed: vLLM's sampling seed (the rank is added, so ranks draw different samples).
        stop_token_ids: stop ids besides the eos ids.
        llm_kwargs: any other ``vllm.LLM`` argument (e.g. ``max_model_len``, ``enforce_eager``).
    """

    def __init__(
        self,
        tokenizer: Any,
        model: Mapping[str, Any],
        gpu_memory_utilization: float = 0.4,
        dtype: str = "bfloat16",
        enable_sleep_mode: bool = True,
        sleep_level: int = 2,
        enable_prefix_caching: bool = True,
        seed: int = 0,
        stop_token_ids: list[int] | None = None,
        llm_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if dtype not in DTYPES:
            raise UserError(f"rollout.engine.dtype={dtype!r} is not valid; choose one of: {', '.join(DTYPES)}")
        if sleep_level not in (1, 2):
            raise UserError(f"rollout.engine.sleep_level={sleep_level} is not valid; choose 1 or 2")
        self.vllm = import_vllm()
        # The worker must live in this process to receive weights by reference (no copy through a pipe).
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        source, is_local = model_source(model)
        self.dtype = DTYPES[dtype]
        self.sleep_mode, self.sleep_level = enable_sleep_mode, sleep_level
        self.stop_ids = engine_stop_ids(tokenizer, source, stop_token_ids)
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        kwargs: dict[str, Any] = dict(
            model=source,
            skip_tokenizer_init=True,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_sleep_mode=enable_sleep_mode,
            enable_prefix_caching=enable_prefix_caching,
            seed=seed + (torch.distributed.get_rank() if distributed else 0),
            trust_remote_code=bool(model.get("trust_remote_code", False)),
            generation_config="vllm",
            logprobs_mode="processed_logprobs",
        )
        if not is_local and model.get("revision"):
            kwargs["revision"] = model["revision"]
        if distributed and torch.distributed.get_world_size() > 1:
            # one engine per trainer rank inside the trainer's process group (vLLM's torchrun-style executor)
            kwargs["distributed_executor_backend"] = "external_launcher"
        kwargs.update(llm_kwargs or {})
        self.llm = self.vllm.LLM(**kwargs)
        self.weights_awake = self.kv_awake = True
        self.weights_valid = False  # no push yet (or the weights were discarded by a level-2 sleep)
        self.actor: torch.nn.Module | None = None  # the last pushed actor, pushed again after a level-2 sleep

    def release_memory(self) -> None:
        """Give the engine's GPU memory back to the trainer until the next push or generate (sleep mode)."""
        if self.sleep_mode and (self.weights_awake or self.kv_awake):
            self.llm.sleep(level=self.sleep_level)
            self.weights_awake = self.kv_awake = False
            self.weights_valid = self.weights_valid and self.sleep_level == 1

    def sync_weights(self, actor: torch.nn.Module) -> None:
        """Load ``actor``'s current weights into the engine and drop the prefix cache built on the old ones."""
        if not self.weights_awake:
            self.llm.wake_up(tags=["weights"])
            self.weights_awake = True
        self.llm.collective_rpc(_load_weights, args=(hf_weights(actor, self.dtype),))
        self.llm.reset_prefix_cache()
        self.weights_valid = True
        self.actor = actor

    def generate(
        self, prompts: list[list[int]], sampling: SamplingParams, infos: list[dict[str, Any]] | None = None
    ) -> list[Generation]:
        """Sample one response per prompt; ``infos`` is ignored (see :class:`GenerationEngine`)."""
        if not self.weights_valid:
            if self.actor is None:
                raise RuntimeError("VLLMEngine has no weights: call sync_weights(actor) first (the DataModule does)")
            self.sync_weights(self.actor)  # a level-2 sleep since the last push (e.g. after a validation)
        if not self.weights_awake:
            self.llm.wake_up(tags=["weights"])
            self.weights_awake = True
        if not self.kv_awake:
            self.llm.wake_up(tags=["kv_cache"])
            self.kv_awake = True
        params = self.vllm.SamplingParams(
            n=1,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_new_tokens,
            logprobs=0,
            stop_token_ids=self.stop_ids,
            detokenize=False,
        )
        requests = [self.vllm.TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        outputs = self.llm.generate(requests, sampling_params=params, use_tqdm=False)
        return [to_generation(out.outputs[0]) for out in outputs]

    def close(self) -> None:
        self.llm = None
