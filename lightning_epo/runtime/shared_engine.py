"""One vLLM engine for both stages of a warm-started run: the warm start evaluates its policy on the engine that RL
then generates with, started once for the command instead of once per stage.

Without it a recipe on vLLM started two engines or evaluated its warm start on the hf engine: the smollm2_gridworld
recipe's 8 + 8-episode check took 77 s on the hf engine and vLLM's start 47 s more (RESULTS §17). An engine keeps
nothing of a run that the next could read: every run pushes its actor's weights before its first generation (the
push resets the prefix cache), and vLLM's sampler draws from the process's generators, which the trainer reseeds
every RL step; tests/integration/test_vllm_train.py checks that RL on the warm start's engine logs what it logs on
an engine of its own.

A run that is given a :class:`SharedEngine` builds its vLLM engine (``rollout.engine``, or ``data.val_engine`` for
a stage whose expert plays the training episodes) through it; the DataModule gets a :class:`BorrowedEngine`, whose
``close`` leaves the engine to the command (:func:`shared_by_stages`). A later run whose engine settings differ
(say, another ``model.dtype``) closes the shared engine and starts its own, saying why.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from lightning_epo.rollout.engine import Generation, GenerationEngine, SamplingParams
from lightning_epo.runtime.engine_choice import is_vllm
from lightning_epo.runtime.warm_start import runs_warm_start

log = logging.getLogger(__name__)
ENGINE_KEYS = ("engine", "val_engine")  # the DataModule's engine factories (conf/config.yaml: data)


class BorrowedEngine(GenerationEngine):
    """An engine a run uses but does not own: everything passes through but :meth:`close`."""

    def __init__(self, engine: GenerationEngine) -> None:
        self.engine = engine

    def generate(self, prompts: list[list[int]], sampling: SamplingParams,
                 infos: list[dict[str, Any]] | None = None) -> list[Generation]:
        return self.engine.generate(prompts, sampling, infos)

    def sync_weights(self, actor: torch.nn.Module) -> None:
        self.engine.sync_weights(actor)

    def before_collection(self) -> None:
        self.engine.before_collection()

    def release_memory(self) -> None:
        self.engine.release_memory()

    def close(self) -> None:
        """Nothing: the engine's owner (:class:`SharedEngine`) closes it when the command ends."""


class SharedEngine:
    """The vLLM engine of one command's runs, started by the first run that asks for it."""

    def __init__(self) -> None:
        self.engine: GenerationEngine | None = None
        self.settings: dict[str, Any] | None = None  # the engine's settings but its model (see :func:`settings`)

    def datamodule_engines(self, data: DictConfig) -> dict[str, Callable[..., GenerationEngine]]:
        """The DataModule's factory (``{"engine": f}`` or ``{"val_engine": f}``) for its vLLM engine, ``data`` being
        ``cfg.data``; ``{}`` where it has none."""
        for key in ENGINE_KEYS:
            node = data.get(key)
            if is_vllm(node):
                return {key: self._factory(hydra.utils.instantiate(node), settings(node))}
        return {}

    def _factory(self, make: Callable[..., GenerationEngine], wanted: dict[str, Any]
                 ) -> Callable[..., GenerationEngine]:
        def make_or_lend(tokenizer: Any) -> GenerationEngine:
            if self.engine is not None and self.settings != wanted:
                changed = sorted(k for k in wanted | self.settings if wanted.get(k) != self.settings.get(k))
                log.info("the vLLM engine of the warm start differs from this run's in %s: starting this run's own",
                         ", ".join(changed))
                self.close()
            if self.engine is None:
                self.engine, self.settings = make(tokenizer=tokenizer), wanted
            return BorrowedEngine(self.engine)

        return make_or_lend

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = self.settings = None


def settings(engine: DictConfig) -> dict[str, Any]:
    """An engine node's resolved settings, of its model only what vLLM reads besides the weights' location: a warm
    start's engine serves RL, whose model is the warm start's exported policy (the same architecture and
    tokenizer, other weights, which RL pushes before it generates)."""
    resolved = OmegaConf.to_container(engine, resolve=True)
    model = resolved.pop("model", None) or {}
    resolved["trust_remote_code"] = bool(model.get("trust_remote_code", False))
    return resolved


@contextmanager
def shared_by_stages(cfg: DictConfig, given: SharedEngine | None) -> Iterator[SharedEngine | None]:
    """The engine a run builds its vLLM engine through: ``given`` (a warm start's stage gets its run's), else a new
    one for a run with a warm start, closed when the run ends, however it ends; ``None`` for any other run."""
    if given is not None or not runs_warm_start(cfg):
        yield given
        return
    shared = SharedEngine()
    try:
        yield shared
    finally:
        shared.close()
