"""Generation with a transformers causal LM in the trainer's own process (``rollout=hf``).

The engine runs its own sampling loop with a KV cache instead of ``model.generate``: it needs the
log-prob of every sampled token, and ``generate`` would have to keep full-vocabulary logits for every
step (``output_logits``) and would silently apply the checkpoint's ``generation_config`` sampling
defaults (Qwen2.5 ships ``top_k=20`` and ``repetition_penalty=1.05``). Here the sampling is exactly
``SamplingParams``: temperature, then nucleus (top-p) filtering, nothing else.

Log-probs: each returned log-prob is ``log_softmax(logits / temperature)`` at the sampled id, over the
full vocabulary (before top-p filtering; with temperature 0, greedy, the raw ``log_softmax(logits)``).
That is what the trainer recomputes for the old policy, so the importance ratio starts at 1.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache

from lightning_epo.core.errors import TrainingDiverged
from lightning_epo.models.shards import is_sharded
from lightning_epo.models.weights import gathered_copy
from lightning_epo.rollout.engine import Generation, GenerationEngine, SamplingParams, stop_token_ids

KeyValues = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys and values [rows, kv heads, positions, head dim]


class HFEngine(GenerationEngine):
    """Batched, left-padded sampling from a transformers causal LM (colocated with the trainer).

    ``model`` may be given later through :meth:`sync_weights` (the trainer's actor: the same object,
    so syncing is a rebind). Stop tokens are the tokenizer's eos, the model's
    ``generation_config.eos_token_id`` (e.g. both ``<|im_end|>`` and ``<|endoftext|>`` for Qwen2.5) and
    ``stop_token_ids``. Prompts are processed in chunks of ``batch_size``.
    """

    def __init__(
        self,
        tokenizer: Any,
        model: torch.nn.Module | None = None,
        batch_size: int = 64,
        stop_token_ids: list[int] | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"rollout.batch_size must be >= 1, got {batch_size}")
        self.tokenizer = tokenizer
        self.model = model
        self.batch_size = batch_size
        self.extra_stop_ids = [int(i) for i in stop_token_ids or []]

    def sync_weights(self, actor: torch.nn.Module) -> None:
        """Sample from ``actor`` (an unwrapped transformers causal LM) from now on.

        Under DeepSpeed ZeRO-3 (``actor``'s parameters are shards) the engine samples from a full copy held
        on every rank, refreshed here, as vLLM does: a forward of the sharded actor all-gathers its shards,
        so every rank would have to run the same number of forward passes, while ranks stop generating
        (finished rows, finished episodes) at different points. Every rank must call this, in the same order.
        """
        self.model = gathered_copy(actor, self.model) if is_sharded(actor) else actor

    def stop_ids(self) -> list[int]:
        """The token ids that end a response (sorted, unique; :func:`~lightning_epo.rollout.engine.stop_token_ids`)."""
        config_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        return stop_token_ids(self.tokenizer, config_eos, self.extra_stop_ids)

    def generate(
        self, prompts: list[list[int]], sampling: SamplingParams, infos: list[dict[str, Any]] | None = None
    ) -> list[Generation]:
        """Sample one response per prompt; ``infos`` is ignored (see :class:`GenerationEngine`)."""
        if self.model is None:
            raise RuntimeError("HFEngine has no model: pass model= or call sync_weights(actor) before generate")
        _check_sampling(sampling)
        if any(len(p) == 0 for p in prompts):
            raise ValueError("HFEngine got an empty prompt; every prompt needs at least one token id")
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                stop = torch.tensor(self.stop_ids(), device=self._device())
                results: list[Generation] = []
                for start in range(0, len(prompts), self.batch_size):
                    results.extend(self._generate_chunk(prompts[start : start + self.batch_size], sampling, stop))
        finally:
            self.model.train(was_training)
        return results

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _prefix_cache(self, prefix: list[int]) -> KeyValues:
        """The keys and values ``[1, H, len(prefix), D]`` of every layer for ``prefix``: the chunk's prompts share
        their leading tokens (chat template, system prompt, instruction), which the prefill then reads once, not per
        row (vLLM's prefix caching, inside one call)."""
        ids = torch.tensor([prefix], device=self._device())
        cache = self.model(input_ids=ids, use_cache=True, logits_to_keep=1).past_key_values
        return [(layer.keys, layer.values) for layer in cache.layers]

    def _prefill(self, prompts: list[list[int]], stop: torch.Tensor) -> tuple[torch.Tensor, DynamicCache, torch.Tensor]:
        """The forward of ``prompts`` after their shared prefix's cache, in buckets of rows of similar length
        (:func:`length_buckets`: a pad token costs what a prompt token costs, and an ALFWorld chunk's prompts differ by
        hundreds of tokens), then one KV cache for the decoding steps, each row ``[prefix | pads | own tokens]``.
        Returns the last position's logits ``[n, V]``, that cache and its attention mask ``[n, shared + width]``."""
        device = stop.device
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else int(stop[0])
        shared = common_prefix_length(prompts)
        prefix = self._prefix_cache(prompts[0][:shared]) if shared else None
        own = [len(p) - shared for p in prompts]
        width = max(own)
        buckets = [sorted(bucket) for bucket in length_buckets(own)]  # rows in prompt order: one bucket needs no reordering
        logits, layers = [], []
        for bucket in buckets:
            bucket_width = max(own[row] for row in bucket)
            input_ids = torch.full((len(bucket), bucket_width), pad_id, dtype=torch.long, device=device)
            for i, row in enumerate(bucket):
                input_ids[i, bucket_width - own[row] :] = torch.tensor(prompts[row][shared:], device=device)
            own_mask = _right_aligned_mask([own[row] for row in bucket], bucket_width, device)
            out = self.model(
                input_ids=input_ids,
                attention_mask=torch.cat([own_mask.new_ones(len(bucket), shared), own_mask], dim=1),
                position_ids=shared + (own_mask.cumsum(-1) - 1).clamp(min=0),
                past_key_values=_repeated(prefix, len(bucket)),
                use_cache=True,
                logits_to_keep=1,
            )
            logits.append(out.logits[:, -1])
            layers.append([(_pad_after(layer.keys, shared, width - bucket_width),
                            _pad_after(layer.values, shared, width - bucket_width)) for layer in out.past_key_values.layers])
        own_mask = _right_aligned_mask(own, width, device)
        attention_mask = torch.cat([own_mask.new_ones(len(prompts), shared), own_mask], dim=1)
        if len(buckets) == 1:  # equal lengths (a gridworld turn): the forward's own cache, not a copy of it
            return logits[0], out.past_key_values, attention_mask
        rows = torch.argsort(torch.tensor([row for bucket in buckets for row in bucket], device=device))
        cache = DynamicCache([(torch.cat([k for k, _ in buckets_kv])[rows], torch.cat([v for _, v in buckets_kv])[rows])
                              for buckets_kv in zip(*layers)])  # per layer: every bucket's keys and values, prompt order
        return torch.cat(logits)[rows], cache, attention_mask

    def _generate_chunk(
        self, prompts: list[list[int]], sampling: SamplingParams, stop: torch.Tensor
    ) -> list[Generation]:
        """Sample one response per prompt of the chunk: the prefill runs once per distinct prompt (the rollouts of one
        GRPO group begin alike) after the shared prefix's cache (:meth:`_prefix_cache`), then its logits and KV cache
        are repeated for the rows that share it, and every row samples its own tokens, one per step until it stops."""
        device = stop.device
        distinct, row_of = distinct_prompts(prompts)
        logits, cache, attention_mask = self._prefill(distinct, stop)
        if len(distinct) < len(prompts):  # copies to make; all distinct (an evaluation) keeps the cache as it is
            rows = torch.tensor(row_of, device=device)
            cache.reorder_cache(rows)
            logits, attention_mask = logits[rows], attention_mask[rows]
        next_position = torch.tensor([[len(p)] for p in prompts], device=device)
        finished = torch.zeros(len(prompts), dtype=torch.bool, device=device)
        tokens, logprobs = [], []
        for step in range(sampling.max_new_tokens):
            token, logprob = _pick(logits.float(), sampling)
            tokens.append(token)
            logprobs.append(logprob)
            finished |= torch.isin(token, stop)
            if step == sampling.max_new_tokens - 1 or bool(finished.all()):
                break
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(len(prompts), 1)], dim=1)
            out = self.model(
                input_ids=token[:, None],
                attention_mask=attention_mask,
                position_ids=next_position,
                past_key_values=cache,
                use_cache=True,
            )
            logits = out.logits[:, -1]
            next_position = next_position + 1
        return _cut_at_stop(torch.stack(tokens, 1).tolist(), torch.stack(logprobs, 1).tolist(), set(stop.tolist()))


def length_buckets(lengths: list[int], max_padding: float = 0.1) -> list[list[int]]:
    """Row indices in buckets for padded forwards, longest rows first: a row joins the open bucket while padding the
    bucket's rows to its longest adds at most ``max_padding`` of their own tokens, else it opens the next one.
    Equal lengths (a gridworld turn's prompts) make one bucket; ``[500, 100, 480, 120, 900]`` -> ``[[4], [0, 2], [3, 1]]``."""
    buckets: list[list[int]] = []
    for row in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if buckets:
            bucket = buckets[-1]
            tokens = sum(lengths[i] for i in bucket) + lengths[row]
            if lengths[bucket[0]] * (len(bucket) + 1) <= (1 + max_padding) * tokens:
                bucket.append(row)
                continue
        buckets.append([row])
    return buckets


def _right_aligned_mask(lengths: list[int], width: int, device: torch.device) -> torch.Tensor:
    """``[n, width]``: 1 on each row's last ``lengths[row]`` positions (its tokens, left-padded), else 0."""
    return (torch.arange(width, device=device) >= width - torch.tensor(lengths, device=device)[:, None]).long()


def _repeated(prefix: KeyValues | None, rows: int) -> DynamicCache | None:
    """A cache holding ``prefix``'s keys and values for ``rows`` rows (views; the forward appends to copies)."""
    if prefix is None:
        return None
    return DynamicCache([(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1)) for k, v in prefix])


def _pad_after(states: torch.Tensor, shared: int, pads: int) -> torch.Tensor:
    """``states [n, H, shared + own, D]`` with ``pads`` zero positions inserted after the first ``shared``."""
    if not pads:
        return states
    gap = states.new_zeros(*states.shape[:2], pads, states.shape[-1])
    return torch.cat([states[:, :, :shared], gap, states[:, :, shared:]], dim=2)


def distinct_prompts(prompts: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """The distinct prompts in order of first appearance, and for each prompt the index of its distinct one."""
    index: dict[tuple[int, ...], int] = {}
    row_of = [index.setdefault(tuple(p), len(index)) for p in prompts]
    return [list(p) for p in index], row_of


def common_prefix_length(prompts: list[list[int]]) -> int:
    """The number of leading tokens every prompt shares, leaving each prompt at least one token of its own."""
    shortest = min(len(p) for p in prompts)
    return next((i for i in range(shortest - 1) if len({p[i] for p in prompts}) > 1), shortest - 1)


def _check_sampling(sampling: SamplingParams) -> None:
    if sampling.temperature < 0:
        raise ValueError(f"sampling temperature must be >= 0 (0 = greedy), got {sampling.temperature}")
    if not 0 < sampling.top_p <= 1:
        raise ValueError(f"sampling top_p must be in (0, 1], got {sampling.top_p}")
    if sampling.max_new_tokens < 1:
        raise ValueError(f"sampling max_new_tokens must be >= 1, got {sampling.max_new_tokens}")


def _pick(logits: torch.Tensor, sampling: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose the next token of each row of ``logits [B, V]``; return ids ``[B]`` and their log-probs ``[B]``.

    Logits that are not finite (a diverged policy) raise :class:`TrainingDiverged` instead of torch's sampling
    error; they are checked only once sampling has failed, so the normal path costs nothing."""
    if sampling.temperature == 0:
        token = logits.argmax(-1)
        return token, torch.log_softmax(logits, -1).gather(-1, token[:, None]).squeeze(-1)
    scaled = logits / sampling.temperature
    logprobs = torch.log_softmax(scaled, -1)
    if sampling.top_p < 1:
        scaled = _top_p_filter(scaled, sampling.top_p)
    try:
        token = torch.multinomial(torch.softmax(scaled, -1), 1).squeeze(-1)
    except RuntimeError as error:
        if torch.isfinite(logits).all():
            raise
        message = "the policy's sampling logits are not finite (inf or NaN): its weights have diverged"
        raise TrainingDiverged(message) from error
    return token, logprobs.gather(-1, token[:, None]).squeeze(-1)


def _top_p_filter(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability mass reaches ``top_p`` (always at least one)."""
    sorted_scores, order = scores.sort(-1, descending=True)
    sorted_probs = torch.softmax(sorted_scores, -1)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    drop_sorted = mass_before >= top_p
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return scores.masked_fill(drop, float("-inf"))


def _cut_at_stop(tokens: list[list[int]], logprobs: list[list[float]], stop: set[int]) -> list[Generation]:
    """Cut each row after its first stop token (kept); rows without one end by ``length``."""
    generations = []
    for row_tokens, row_logprobs in zip(tokens, logprobs):
        end = next((i + 1 for i, t in enumerate(row_tokens) if t in stop), None)
        if end is None:
            generations.append(Generation(row_tokens, row_logprobs, "length"))
        else:
            generations.append(Generation(row_tokens[:end], row_logprobs[:end], "stop"))
    return generations
