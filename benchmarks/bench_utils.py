"""Shared helpers of the benchmark scripts: machine description, timing statistics and table printing.

The scripts are run as ``python benchmarks/<name>.py`` (this folder is then on ``sys.path``).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a plain script from any directory
    sys.path.insert(0, str(REPO_ROOT))

from lightning_epo.core.machine import cpu_name  # noqa: E402


def machine_line() -> str:
    """One line describing where a figure was measured: CPU, cores, load, torch and its threads, GPU."""
    import torch  # here, not at the top: rollout.py's spawned env workers import this module and need no torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return (
        f"machine: {cpu_name()}, {cores} cores, load average (1/5/15 min) {load}; "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads); GPU: {gpu}"
    )


# The SmolLM2 recipes' adapters (conf/experiment/smollm2_*.yaml: r 16, alpha 32, every linear layer), as a
# ``model.lora`` node for load_actor / load_critic
RECIPE_LORA = {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear", "critic": False}


def cpu_seconds(fn: Callable[[], object]) -> float:
    """The process CPU time ``fn()`` takes (on a shared machine wall time counts the other jobs too)."""
    began = time.process_time()
    fn()
    return time.process_time() - began


def lora_actor_update(actor, ids, mask, response: int) -> None:
    """One forward and backward of a LoRA actor (a ``PeftModel`` of a causal LM) as the update runs it on rows
    ``ids`` ``[N, L]`` whose last ``response`` tokens are the answer: the output layer on the response positions
    only, the backward pass to the adapters."""
    import torch

    base = actor.get_base_model()
    hidden = base.model(input_ids=ids, attention_mask=mask).last_hidden_state
    logits = base.lm_head(hidden[:, -response - 1 : -1])
    torch.log_softmax(logits.float(), -1).gather(-1, ids[:, -response:, None]).mean().backward()


def median(values: list[float]) -> float:
    return statistics.median(values)


def spread(values: list[float]) -> str:
    """``min-max`` of ``values`` for a table cell."""
    return f"{min(values):.3g}-{max(values):.3g}"


def print_table(headers: list[str], rows: list[list[object]]) -> None:
    """A Markdown table (pastes straight into RESULTS.md)."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in cells:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
