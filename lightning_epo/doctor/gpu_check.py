"""``make gpu-check`` (``python -m lightning_epo.doctor.gpu_check``): the acceptance check of a CUDA machine, in at
most 10 minutes on one GPU. Two RL steps (gridworld, ``debug=fast``) of each case through ``train.py`` as a user
runs it, then a table of generation tokens/s, update time and peak GPU memory:

- ``trainer=gpu`` (bf16-mixed): the tiny model, with ``model.lora.r=8``, and
  SmolLM2-135M-Instruct where its files exist (``make smollm2``);
- ``rollout=vllm`` (with ``.venv-vllm``'s Python) and vLLM's log-probs after a weight push against the trainer's
  (benchmarks/vllm_logprob_check.py at bfloat16: mean |difference| <= 2e-2, 99th percentile <= 0.2);
- DeepSpeed ZeRO-2 and ZeRO-3 on one GPU, and with two or more GPUs DDP, ZeRO-2 and ZeRO-3 on two.

A case whose piece is not installed here is reported ``missing`` with what installs it, never as passed. Exits 1
when a case fails or nothing can run (no CUDA device: one line saying so).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lightning_epo.doctor.checks import REPO
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
SMOLLM2 = REPO / "data" / "smollm2-135m-instruct"
TWO_STEPS = ("~experiment", "debug=fast", "logger=csv", "~callbacks.progress_bar", "test_every=1000", "model=tiny")
CASE_TIMEOUT_S = 150


@dataclass(frozen=True)
class Case:
    """One run of the check: ``train.py`` with ``overrides`` (or a whole ``command``), or why it cannot run here."""

    name: str
    overrides: tuple[str, ...] = ()
    python: str = sys.executable
    command: tuple[str, ...] = ()
    missing: str | None = None


@dataclass
class Result:
    case: Case
    status: str  # passed | FAILED | missing
    seconds: float = 0.0
    figures: dict[str, float] = field(default_factory=dict)
    note: str = ""


def vllm_python() -> str | None:
    """The Python that has vLLM: this one, or .venv-vllm's."""
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    return str(VLLM_PYTHON) if VLLM_PYTHON.exists() else None


def cases(gpus: int, trainer: str = "trainer=gpu") -> list[Case]:
    """The check's cases on a machine with ``gpus`` CUDA devices (``trainer``: what replaces ``trainer=gpu``)."""
    single = (*TWO_STEPS, trainer)
    smollm2 = None if (SMOLLM2 / "config.json").is_file() else f"no {SMOLLM2.relative_to(REPO)}: make smollm2"
    no_deepspeed = None if importlib.util.find_spec("deepspeed") else "DeepSpeed not installed: pip install -r " \
                                                                      "requirements.txt"
    vllm = vllm_python()
    no_vllm = None if vllm else "vLLM not installed: make setup-vllm"
    found = [
        Case("tiny", single),
        Case("tiny, LoRA r=8", (*single, "model.lora.r=8")),
        Case("SmolLM2-135M", (*single, "model=smollm2-135m"), missing=smollm2),
        Case("SmolLM2-135M, LoRA r=8", (*single, "model=smollm2-135m", "model.lora.r=8"), missing=smollm2),
        Case("tiny, rollout=vllm", (*single, "rollout=vllm"), python=vllm or "", missing=no_vllm),
        Case("vLLM log-probs (bf16)", command=("benchmarks/vllm_logprob_check.py", "--dtype", "bfloat16"),
             python=vllm or "", missing=no_vllm),
    ]
    for stage in (2, 3):
        found.append(Case(f"tiny, ZeRO-{stage}, 1 GPU", (*single, f"trainer=deepspeed_stage_{stage}",
                                                         "trainer.devices=1"), missing=no_deepspeed))
    if gpus >= 2:
        found.append(Case("tiny, DDP, 2 GPUs", (*single, "trainer=ddp", "trainer.devices=2")))
        for stage in (2, 3):
            found.append(Case(f"tiny, ZeRO-{stage}, 2 GPUs", (*single, f"trainer=deepspeed_stage_{stage}",
                                                              "trainer.devices=2"), missing=no_deepspeed))
    return found


def figures(run_dir: Path) -> dict[str, float]:
    """Generation tokens/s and update seconds (means over the RL steps) and the peak GPU memory (the largest)."""
    rows = list(csv.DictReader((run_dir / "csv" / "metrics.csv").open()))

    def values(name: str) -> list[float]:
        return [float(row[name]) for row in rows if row.get(name)]

    found = {}
    for name, combine in (("perf/gen_tokens_per_s", "mean"), ("perf/update_s", "mean"),
                          ("perf/peak_memory_gib", "max")):
        if values(name):
            found[name] = max(values(name)) if combine == "max" else sum(values(name)) / len(values(name))
    return found


ERROR_LINE = re.compile(r"^(error:|[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b)")


def error_line(output: str) -> str:
    """The line that says why a run failed: its last ``error:`` line or exception (Hydra's hint and NCCL's exit
    warnings follow it), else its last line."""
    lines = output.strip().splitlines() or [""]
    return next((line for line in reversed(lines) if ERROR_LINE.match(line)), lines[-1])


def run_case(case: Case, out: Path) -> Result:
    if case.missing:
        return Result(case, "missing", note=case.missing)
    run_dir = out / "".join(c if c.isalnum() else "-" for c in case.name.lower())
    command = [case.python, *case.command] if case.command else \
        [case.python, "train.py", *case.overrides, f"hydra.run.dir={run_dir}"]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=CASE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return Result(case, "FAILED", CASE_TIMEOUT_S, note=f"still running after {CASE_TIMEOUT_S} s")
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        return Result(case, "FAILED", seconds, note=f"exit {done.returncode}: {error_line(done.stdout + done.stderr)[:150]}")
    if case.command:
        return Result(case, "passed", seconds, note=done.stdout.strip().splitlines()[-1])
    return Result(case, "passed", seconds, figures(run_dir))


def table(results: list[Result]) -> str:
    """A markdown table of the results."""
    lines = ["| case | result | s | gen tokens/s | update s | peak GiB | note |", "|---|---|---|---|---|---|---|"]
    for r in results:
        f = r.figures
        cells = [f"{f[k]:.{d}f}" if k in f else "" for k, d in
                 (("perf/gen_tokens_per_s", 0), ("perf/update_s", 2), ("perf/peak_memory_gib", 2))]
        lines.append(f"| {r.case.name} | {r.status} | {r.seconds:.0f} | {' | '.join(cells)} | {r.note} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "outputs" / "gpu-check"), help="where the runs write")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu-check: no CUDA device is visible on this machine (torch.cuda.is_available() is False): run it on a "
              "GPU machine; `python -m lightning_epo.doctor` checks this one")
        return 1
    gpus = torch.cuda.device_count()
    print(f"gpu-check: {gpus} x {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    results = []
    for case in cases(gpus):
        results.append(run_case(case, Path(args.out)))
        print(f"{results[-1].status:<7} {case.name} {results[-1].note}", flush=True)
    print(table(results))
    return 1 if any(r.status == "FAILED" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
