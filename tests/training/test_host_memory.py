"""The heap's free memory goes back to the system after an update (lightning_epo/training/host_memory.py)."""

from __future__ import annotations

import pytest
import torch

from lightning_epo.training.host_memory import STATM, _malloc_trim, release_free_memory, resident_gib

glibc = pytest.mark.skipif(not STATM.exists() or _malloc_trim() is None,
                           reason="glibc's malloc_trim and Linux's /proc/self/statm")


def fragmented_free_blocks(n: int) -> list[torch.Tensor]:
    """Leave ``n`` MiB freed inside malloc's arena and still resident, as an update's activations do: a freed 16 MiB
    block raises glibc's mmap threshold, so the 1 MiB blocks after it come from the arena; every other one is freed,
    and the live ones between keep the freed from merging into the arena's top. Returns the live blocks (keep them)."""
    large = torch.ones(4 * 2**20)  # 16 MiB, mmapped: freeing it raises the threshold to its size
    del large
    blocks = [torch.ones(2**18 + 256 * (i % 7)) for i in range(2 * n)]  # 1 MiB and a little, pages written
    return blocks[1::2]


@glibc
def test_memory_freed_inside_the_arena_stays_resident_until_it_is_handed_back():
    """The bug first: 256 MiB freed by torch stays in the process (the recipe's 6.8 GiB after one step); then the
    hand-back returns it and says how much."""
    release_free_memory()  # what earlier tests left free would otherwise serve the blocks without new pages
    start = resident_gib()
    kept = fragmented_free_blocks(256)
    held = resident_gib() - start
    assert held > 0.45, f"the freed blocks did not stay resident ({held:.2f} GiB): the premise of the fix is gone"
    released = release_free_memory()
    assert released == pytest.approx(0.25, abs=0.05)
    assert resident_gib() - start == pytest.approx(0.25, abs=0.05)  # the live half stays
    del kept


def test_nothing_to_hand_back_reports_about_zero():
    release_free_memory()
    assert release_free_memory() == pytest.approx(0.0, abs=0.02)


def test_without_malloc_trim_nothing_is_done_or_reported(monkeypatch):
    monkeypatch.setattr("lightning_epo.training.host_memory._malloc_trim", lambda: None)
    assert release_free_memory() is None
