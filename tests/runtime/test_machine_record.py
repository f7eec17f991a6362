"""``machines.jsonl``: each start of a run appends where it ran and the precision its config resolved to there; the
global rank 0 alone writes it."""

from __future__ import annotations

import json

from lightning.pytorch.utilities import rank_zero_only

from lightning_epo.runtime import config
from lightning_epo.runtime.machine_record import record_machine, recorded_precisions


def test_each_start_appends_the_precision_its_config_resolved_to_on_this_machine(compose_cfg, tmp_path, monkeypatch):
    monkeypatch.setattr(config, "cpu_computes_bf16", lambda: True)
    record_machine(compose_cfg("experiment=smollm2_sciworld"), tmp_path, resumed=False)
    monkeypatch.setattr(config, "cpu_computes_bf16", lambda: False)
    record_machine(compose_cfg("experiment=smollm2_sciworld"), tmp_path, resumed=True)
    record_machine(compose_cfg("experiment=smollm2_sciworld"), tmp_path, resumed=True)

    lines = [json.loads(line) for line in (tmp_path / "machines.jsonl").read_text().splitlines()]
    assert [(line["precision"], line["resumed"]) for line in lines] == [
        ("bf16-mixed", False), ("32-true", True), ("32-true", True)]
    assert all(line["cpu"] and line["torch"] and line["gpu"] is None for line in lines)
    assert recorded_precisions(tmp_path) == ["bf16-mixed", "32-true"]
    assert recorded_precisions(tmp_path / "elsewhere") == []  # a run from before the record


def test_other_ranks_record_nothing(compose_cfg, tmp_path, monkeypatch):
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    record_machine(compose_cfg(), tmp_path, resumed=False)
    assert not (tmp_path / "machines.jsonl").exists()
