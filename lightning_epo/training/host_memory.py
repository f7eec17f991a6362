"""The trainer process's free heap memory, handed back to the operating system after every update.

On a CPU the update's activations are host memory from the C library's malloc (torch's CPU allocator calls
``posix_memalign``). glibc serves a block under its mmap threshold from its arenas, and the threshold rises with
every large block freed, up to 32 MiB; a freed block stays in the arena for reuse, and only the arena's top goes
back to the system. Activations of varying sizes (an episode's rows a micro-batch) leave most of what they used
free but resident. Measured on the ScienceWorld recipe (``experiment=smollm2_sciworld``, SmolLM2-135M, bf16,
2026-12-03, Intel Xeon 2 cores AVX-512; glibc's ``mallinfo2`` read after each RL step): 11.0 GiB resident after
the first step, of which 6.8 GiB free inside the arenas, 1.3 GiB in use and 1.0 GiB of live tensors; 13.0 GiB
after the second (8.7 GiB free); a 24-step run was killed for memory at 20.5 GB in its 15th step. Handing the free
pages back (glibc's ``malloc_trim(0)``) took the process from 11.2 to 4.2 GiB there. It does not stop the growth
(each update faults in more than the one before, a fresh process undoes it): what it gives is the figure that shows
the growth, ``perf/host_released_gib``, and the memory between updates for the rest of the machine.
docs/real_model.md, "ScienceWorld", has the figures and the alternatives measured (a fixed mmap threshold, jemalloc).

Where the C library has no ``malloc_trim`` (macOS, musl) nothing is done and nothing is reported.
"""

from __future__ import annotations

import ctypes
import resource
from functools import cache
from pathlib import Path
from typing import Callable

STATM = Path("/proc/self/statm")  # Linux: the process's sizes in pages, the resident size second


def resident_gib() -> float:
    """This process's resident set size now, in GiB (Linux: ``/proc/self/statm``)."""
    return int(STATM.read_text().split()[1]) * resource.getpagesize() / 2**30


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` from the process's own symbols, or ``None`` where the C library has none."""
    return getattr(ctypes.CDLL(None), "malloc_trim", None)


def release_free_memory() -> float | None:
    """Give the heap's free pages back to the system (``malloc_trim(0)``: every arena, not just its top); returns
    the GiB the resident size fell by, or ``None`` where this C library or system cannot do or measure it."""
    trim = _malloc_trim()
    if trim is None or not STATM.exists():
        return None
    before = resident_gib()
    trim(0)
    return max(before - resident_gib(), 0.0)
