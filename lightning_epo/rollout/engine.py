"""Generation engines: token ids in, token ids (and their log-probs) out.

Token in, token out (DESIGN.md): the trainer trains on exactly the ids an engine returns,
never on re-tokenised decoded text.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

import torch

from lightning_epo.core.errors import UserError


def stop_token_ids(tokenizer: Any, config_eos: int | list[int] | None, extra: list[int] | None) -> list[int]:
    """The ids that end a response (sorted, unique): the tokenizer's eos, the checkpoint's
    ``generation_config.eos_token_id`` (one id or several, e.g. Qwen2.5's ``<|im_end|>`` and
    ``<|endoftext|>``) and ``extra`` (``rollout.engine.stop_token_ids``)."""
    ids = {int(i) for i in extra or []}
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    if config_eos is not None:
        ids.update(int(i) for i in ([config_eos] if isinstance(config_eos, int) else config_eos))
    if not ids:
        raise UserError("the engine has no stop token: the tokenizer has no eos token; set rollout.engine.stop_token_ids")
    return sorted(ids)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 512


@dataclass
class Generation:
    """One sampled response. ``finish_reason`` is ``stop`` (an end token) or ``length`` (the cap).

    ``logprobs``: each sampled token's log-prob under the distribution it was drawn from, ``log_softmax(logits / T)``
    (what the trainer recomputes as the old policy's); None from an engine that samples from no policy (the expert).
    ``learned=False`` marks a response that is played but must not be trained on (a noisy expert's
    exploratory action: DART learns the expert's answers at the states the noise leads to, not the noise).
    ``cached_prompt_tokens``: how many of the prompt's tokens the engine's prefix cache served (their KV blocks
    reused, not computed); None from an engine without a prefix cache (hf, the expert).
    """

    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: str
    learned: bool = True
    cached_prompt_tokens: int | None = None


class GenerationEngine(abc.ABC):
    """Samples responses for a batch of prompts."""

    @abc.abstractmethod
    def generate(
        self, prompts: list[list[int]], sampling: SamplingParams, infos: list[dict[str, Any]] | None = None
    ) -> list[Generation]:
        """Sample one response per prompt. ``infos`` are the environments' current info dicts
        (only engines that play the environment's expert read them)."""

    def sync_weights(self, actor: torch.nn.Module) -> None:
        """Make the engine sample from ``actor``'s current weights (called after every update)."""

    def before_collection(self) -> None:
        """Get ready to generate; called on every rank at the start of each collection (a rollout, an evaluation
        split), whatever the rank's share of its episodes. Work that other ranks must join (a vLLM engine pushing
        the weights a sleep discarded: under ZeRO-3 the push gathers shards) happens here, never in ``generate``,
        which a rank without episodes never calls. A no-op for engines that keep their weights."""

    def release_memory(self) -> None:
        """Give accelerator memory back between rollouts (vLLM sleeps); a no-op for colocated engines."""

    def close(self) -> None:
        """Free the engine's resources."""
