"""Where a run ran: one line in ``RUN_DIR/machines.jsonl`` each time it starts (a resume included), with the CPU or
GPU, the precision its config resolved to there, and torch's version (DESIGN.md: a result names the CPU or GPU it
ran on). The recipes pick their precision by the CPU (``${native_bf16:bf16-mixed,32-true}``), so one command trains
in bf16 on one machine and in float32 on another, and ``.hydra/config.yaml`` keeps only the interpolation: this record
is what tells the two apart (the compare tool refuses a seed whose runs would mix them)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import torch
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig

from lightning_epo.core import layout
from lightning_epo.core.machine import cpu_name
from lightning_epo.runtime.config import cpu_computes_bf16


@rank_zero_only
def record_machine(cfg: DictConfig, run_dir: Path, resumed: bool) -> None:
    """Append this start's machine to ``run_dir/machines.jsonl`` (the global rank 0 alone)."""
    on_gpu = cfg.trainer.get("accelerator") in ("gpu", "cuda") and torch.cuda.is_available()
    line = {"started": datetime.now().isoformat(timespec="seconds"), "resumed": resumed,
            "precision": str(cfg.trainer.precision), "cpu": cpu_name(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "bf16_native": cpu_computes_bf16(),
            "gpu": torch.cuda.get_device_name(0) if on_gpu else None, "torch": torch.__version__}
    with open(run_dir / layout.MACHINES, "a") as file:
        file.write(json.dumps(line) + "\n")


def recorded_precisions(run_dir: Path) -> list[str]:
    """The precisions the run's starts recorded, each once, in the order first seen ([] where it recorded none: a
    run from before the record)."""
    path = run_dir / layout.MACHINES
    lines = path.read_text().splitlines() if path.is_file() else []
    return list(dict.fromkeys(json.loads(line)["precision"] for line in lines if line.strip()))
