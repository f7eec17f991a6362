"""Which malloc a process runs on, and how to run it on jemalloc.

Under glibc's malloc a CPU run's heap grows over its updates (training/host_memory.py); under jemalloc it did not,
but its updates were slower (docs/host_allocator_cpu.md, paired), so nothing preloads it: the doctor's line names the
preload for a CPU run long enough to grow (doctor/checks.py), and a run whose growth would outrun the machine says so
(callbacks/host_memory_watch.py). An allocator is chosen before the process starts, by ``LD_PRELOAD``:
:func:`current` says which one this process has, :func:`find_jemalloc` where an installed one is.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

JEMALLOC_PLACES = tuple(Path(lib) / "libjemalloc.so.2" for lib in (  # Debian/Ubuntu, Fedora/RHEL, source builds
    "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib"))


def current() -> str:
    """The malloc this process runs on, told by a symbol only it exports: ``"jemalloc"`` (``mallctl``),
    ``"tcmalloc"`` (``MallocExtension_GetNumericProperty``), ``"glibc"`` (``malloc_trim``: looked up last, since a
    preloaded allocator leaves glibc loaded beneath it), else ``"unknown"``."""
    symbols = ctypes.CDLL(None)
    for symbol, name in (("mallctl", "jemalloc"), ("MallocExtension_GetNumericProperty", "tcmalloc"),
                         ("malloc_trim", "glibc")):
        if hasattr(symbols, symbol):
            return name
    return "unknown"


def find_jemalloc() -> Path | None:
    """An installed ``libjemalloc.so.2`` in the usual library folders (``JEMALLOC_PLACES``), or ``None``."""
    return next((path for path in JEMALLOC_PLACES if path.is_file()), None)


def preload_advice() -> str:
    """How to run on jemalloc here: ``LD_PRELOAD`` of the installed library, or how to install it."""
    library = find_jemalloc()
    if library is not None:
        return f"LD_PRELOAD={library}"
    return "apt install libjemalloc2, then LD_PRELOAD=<its libjemalloc.so.2>"
