"""Per-RL-step seeding: the random streams of step k on rank r are a pure function of ``(seed, k, r)``.

The module reseeds Python's ``random``, NumPy and torch (CPU and CUDA) at the start of every RL step, like
the TaskSampler draws tasks. Consequences:

- exact resume: the checkpoint's RL step *is* the RNG state, so ``stop_at_step`` + ``ckpt_path=last``
  logs the same values as an uninterrupted run (tests/integration/test_exact_resume.py). Saving and
  restoring generator states instead would not survive what runs between a save and the next step
  (a validation, a new dataloader iterator, each of which draws from torch's generator);
- changing ``test_every`` never changes the training trajectory (evaluation draws cannot shift it);
- ranks sample different responses (the rank is part of the seed).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch


def step_seed(seed: int, step: int, rank: int) -> int:
    """A 63-bit seed for RL step ``step`` on rank ``rank`` (stable across Python processes and versions)."""
    digest = hashlib.sha256(f"lightning-epo/{seed}/{step}/{rank}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def seed_rl_step(seed: int, step: int, rank: int) -> None:
    """Seed ``random``, NumPy and torch (all devices) for RL step ``step`` on rank ``rank``."""
    value = step_seed(seed, step, rank)
    random.seed(value)
    np.random.seed(value % 2**32)
    torch.manual_seed(value)


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
