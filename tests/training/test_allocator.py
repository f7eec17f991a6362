"""A process says which malloc it runs on and where an installed jemalloc is (lightning_epo/training/allocator.py)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest

from lightning_epo.training import allocator
from lightning_epo.training.allocator import current, find_jemalloc

on_glibc = pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "malloc_trim") or "malloc" in os.environ.get(
    "LD_PRELOAD", ""), reason="glibc's malloc (malloc_trim), no allocator preloaded into the test process")


@on_glibc
def test_a_process_without_a_preload_runs_on_glibc_s_malloc():
    assert current() == "glibc"


@pytest.mark.parametrize(("symbol", "name"), [("mallctl", "jemalloc"), ("MallocExtension_GetNumericProperty",
                                                                        "tcmalloc"), ("malloc_trim", "glibc")])
def test_an_allocator_is_told_by_the_symbol_only_it_exports(monkeypatch, symbol, name):
    """jemalloc's ``mallctl`` and tcmalloc's ``MallocExtension_*`` are looked up before glibc's ``malloc_trim``,
    which a preloaded allocator leaves in place (glibc is still loaded beneath it)."""
    symbols = type("Symbols", (), {symbol: object(), "malloc_trim": object()})()
    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda name: symbols)
    assert current() == name
    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda name: object())
    assert current() == "unknown"


def test_a_jemalloc_is_found_in_the_usual_places_only_where_it_is(tmp_path, monkeypatch):
    library = tmp_path / "lib" / "libjemalloc.so.2"
    monkeypatch.setattr(allocator, "JEMALLOC_PLACES", (tmp_path / "none" / "libjemalloc.so.2", library))
    assert find_jemalloc() is None
    library.parent.mkdir()
    library.write_bytes(b"")
    assert find_jemalloc() == library


@pytest.mark.skipif(find_jemalloc() is None, reason="no jemalloc installed in the usual places")
def test_a_preloaded_jemalloc_is_named():
    named = subprocess.run([sys.executable, "-c", "from lightning_epo.training.allocator import current; "
                            "print(current())"], env=os.environ | {"LD_PRELOAD": str(find_jemalloc())},
                           capture_output=True, text=True, check=True).stdout.strip()
    assert named == "jemalloc"
