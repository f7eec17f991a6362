"""Per-RL-step seeding: the random streams of step k on rank r are a pure function of ``(seed, k, r)``.

The module reseeds Python's ``random``, NumPy and torch (CPU and CUDA) at the start of every RL step, like
the TaskSampler draws tasks. Consequences:

- exact resume: the checkpoint's RL step *is* the RNG state, so ``stop_at_step`` + ``ckpt_path=last``
  logs the same values as an uninterrupted run (tests/integration/test_exact_resume.py). Saving and
  restoring generator states instead would not survive what runs between a save and the next step
  (a validation, a new dataloader iterator, each of which draws from torch's generator);
- changing ``test_every`` never changes the training trajectory (evaluation draws cannot shift it);
- an evaluation draws from streams of its own, a pure function of ``(seed, k, split, r)`` after k RL steps, and
  leaves the training's as they were (:func:`evaluation_seeded`): a run resumed into an evaluation it did not
  finish plays the one an uninterrupted run plays (tests/integration/test_resume_evaluation.py);
- ranks sample different responses (the rank is part of the seed).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch


def step_seed(seed: int, step: int, rank: int, stream: str = "") -> int:
    """A 63-bit seed for RL step ``step`` on rank ``rank`` (stable across Python processes and versions); a named
    ``stream`` (an evaluation's) gets seeds of its own."""
    digest = hashlib.sha256(f"lightning-epo/{stream}{seed}/{step}/{rank}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _seed_generators(value: int) -> None:
    """Seed ``random``, NumPy and torch (all devices) with ``value``."""
    random.seed(value)
    np.random.seed(value % 2**32)
    torch.manual_seed(value)


def seed_rl_step(seed: int, step: int, rank: int) -> None:
    """Seed ``random``, NumPy and torch (all devices) for RL step ``step`` on rank ``rank``."""
    _seed_generators(step_seed(seed, step, rank))


@contextmanager
def global_rng_kept() -> Iterator[None]:
    """Restore the state of ``random``, NumPy and torch (CPU and this process's CUDA device) on exit.

    For code that reseeds the process's global generators as a side effect (vLLM's worker calls
    ``set_random_seed`` when its engine starts in this process): the trainer's draws after it are those it
    would have made without it.
    """
    py_state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if torch.cuda.is_available() else []):
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


@contextmanager
def evaluation_seeded(seed: int, step: int, split: str, rank: int) -> Iterator[None]:
    """Seed the generators for the evaluation of ``split`` after ``step`` RL steps on rank ``rank``, and give the
    process back the states it had (:func:`global_rng_kept`)."""
    with global_rng_kept():
        _seed_generators(step_seed(seed, step, rank, stream=f"eval/{split}/"))
        yield
