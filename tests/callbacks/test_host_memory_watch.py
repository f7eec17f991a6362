"""The host memory's growth is told once, at the step where it first outruns the machine (callbacks/
host_memory_watch.py; the rule itself: tests/training/test_host_memory.py)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from lightning_epo.callbacks import host_memory_watch
from lightning_epo.callbacks.host_memory_watch import HostMemoryWatch

GIB = 2**30


def steps(watch: HostMemoryWatch, count: int, devices: int = 1, rank_zero: bool = True) -> None:
    """``count`` more RL steps' ends (the module's ``rl_step`` counts the completed ones)."""
    trainer = SimpleNamespace(is_global_zero=rank_zero, num_devices=devices)
    for _ in range(count):
        watch.on_train_batch_end(trainer, SimpleNamespace(rl_step=len(watch.peaks) + 1), None, None, 0)


def test_growth_that_outruns_the_machine_is_told_once(monkeypatch, caplog):
    """1 GiB a step from 10 GiB on a 24 GiB machine over 24 steps: told after the fourth step (three steps of
    growth), not again; half the machine each for 2 processes: the same growth from 6 GiB is told too."""
    peaks = iter([10.0, 11.0, 12.0, 13.0, 14.0, 15.0])
    monkeypatch.setattr(host_memory_watch, "host_peak_rss_gib", lambda: next(peaks))
    monkeypatch.setattr(host_memory_watch.psutil, "virtual_memory", lambda: SimpleNamespace(total=24 * GIB))
    watch = HostMemoryWatch(total_steps=24)
    with caplog.at_level(logging.WARNING, logger=host_memory_watch.__name__):
        steps(watch, 3)
        assert caplog.records == []
        steps(watch, 3)
    assert len(caplog.records) == 1 and "near RL step 15 of 24" in caplog.records[0].getMessage()


def test_the_machine_is_shared_by_the_node_s_processes(monkeypatch, caplog):
    peaks = iter([6.0, 6.5, 7.0, 7.5])
    monkeypatch.setattr(host_memory_watch, "host_peak_rss_gib", lambda: next(peaks))
    monkeypatch.setattr(host_memory_watch.psutil, "virtual_memory", lambda: SimpleNamespace(total=24 * GIB))
    with caplog.at_level(logging.WARNING, logger=host_memory_watch.__name__):
        steps(HostMemoryWatch(total_steps=24), 4, devices=2)  # 7.5 + 0.5 * 20 = 17.5 > 12
    assert len(caplog.records) == 1 and "the 12.0 GiB it has" in caplog.records[0].getMessage()


def test_other_ranks_do_not_tell_it(monkeypatch, caplog):
    peaks = iter([10.0, 11.0, 12.0, 13.0])
    monkeypatch.setattr(host_memory_watch, "host_peak_rss_gib", lambda: next(peaks))
    with caplog.at_level(logging.WARNING, logger=host_memory_watch.__name__):
        steps(HostMemoryWatch(total_steps=1000), 4, rank_zero=False)
    assert caplog.records == []
