"""``make gpu-check`` (``python -m lightning_epo.doctor.gpu_check``): the acceptance check of a CUDA machine, in at
most 10 minutes on one GPU. Two RL steps (gridworld, ``debug=fast``) of each case through ``train.py`` as a user
runs it, then a table of the step's parts, generation tokens/s, the update's share of the matmul peak and peak GPU
memory:

- ``trainer=gpu`` (bf16-mixed): the tiny model, with ``model.lora.r=8``, and
  SmolLM2-135M-Instruct where its files exist (``make smollm2``);
- ``rollout=vllm`` (with ``.venv-vllm``'s Python) and vLLM's log-probs after a weight push against the trainer's
  (benchmarks/vllm_logprob_check.py at bfloat16: mean |difference| <= 2e-2, 99th percentile <= 0.2); vLLM is
  required: without ``.venv-vllm``, or where vLLM does not import, the check stops at once with one line;
- DeepSpeed ZeRO-2 and ZeRO-3 on one GPU, and with two or more GPUs DDP, ZeRO-2 and ZeRO-3 on two, and DDP and
  ZeRO-3 with a vLLM engine per rank, evaluated on fewer tasks than ranks (a rank with no episode still joins every
  weight push);
- Qwen2.5-1.5B's shape (its config.json in data/model_shapes, random weights drawn on the GPU:
  lightning_epo/models/shaped.py) as a user of a real model runs it: GRPO+EPO, bf16, LoRA r 32, gradient
  checkpointing, the hf engine, rows as long as the prompt and answer caps (the random model answers to the cap,
  the prompt cap is just above the prompt's fixed text). Its step's parts, the update's share of the bf16 matmul
  peak, and its peak memory against the doctor's estimate for the same configuration: more than 20 % off fails.

A case whose piece is not installed here is reported ``missing`` with what installs it, never as passed. A case
runs under its own limit, cut to what is left of the check's budget (:data:`CHECK_BUDGET_S`); a case the budget
cannot start fails. Exits 1 when a case fails or nothing can run (no CUDA device, no vLLM: one line saying so).
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

from lightning_epo.doctor.checks import ASSUMED_GPU_BYTES, REPO, compose_run
from lightning_epo.doctor.memory import GIB, Shape, estimate
from lightning_epo.models.shaped import SHAPES, build_shaped_model

VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
SMOLLM2 = REPO / "data" / "smollm2-135m-instruct"
TWO_STEPS = ("~experiment", "debug=fast", "logger=csv", "~callbacks.progress_bar", "test_every=1000", "model=tiny")
CASE_TIMEOUT_S = 150
# A vLLM engine's first start on a machine compiles the model (torch.compile) and captures CUDA graphs: minutes, and
# the check runs on fresh machines. Its cases get this much more.
VLLM_STARTUP_S = 300
CHECK_BUDGET_S = 40 * 60  # the whole check, all cases (one GPU: about 10 minutes when warm)
# Two RL steps, then an evaluation of one episode a split: on two ranks, one of them plays none
EVALUATED_ON_FEWER_TASKS_THAN_RANKS = (*(o for o in TWO_STEPS if not o.startswith("test_every=")), "test_every=2",
                                       "env.val_size=1")
# A real model's case: GRPO+EPO with LoRA on a bf16 base (as experiment=alfworld_1gpu); 3 turns of 192-token prompts
# (the fixed text is 143 tokens) and 128-token answers fill whole 4096-token micro-batches.
QWEN_1_5B = ("model=qwen2.5-1.5b", "algo=grpo_epo", "model.lora.r=32", "model.lora.alpha=64",
             "model.max_prompt_tokens=192", "rollout.max_new_tokens=128")
ESTIMATE_TOLERANCE = 0.2  # the measured peak memory within 20 % of the doctor's estimate


@dataclass(frozen=True)
class Case:
    """One run of the check: ``train.py`` with ``overrides`` (or a whole ``command``), or why it cannot run here."""

    name: str
    overrides: tuple[str, ...] = ()
    python: str = sys.executable
    command: tuple[str, ...] = ()
    missing: str | None = None
    shape: Path | None = None  # a folder with a config.json: the case runs that shape with random weights
    timeout_s: int = CASE_TIMEOUT_S


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
        Case("tiny, rollout=vllm", (*single, "rollout=vllm"), python=vllm or "", missing=no_vllm,
             timeout_s=CASE_TIMEOUT_S + VLLM_STARTUP_S),
        Case("vLLM log-probs (bf16)", command=("benchmarks/vllm_logprob_check.py", "--dtype", "bfloat16"),
             python=vllm or "", missing=no_vllm, timeout_s=CASE_TIMEOUT_S + VLLM_STARTUP_S),
        Case("Qwen2.5-1.5B (random weights), LoRA r=32", (*single, *QWEN_1_5B), shape=SHAPES / "qwen2.5-1.5b-instruct",
             timeout_s=300),
    ]
    for stage in (2, 3):
        found.append(Case(f"tiny, ZeRO-{stage}, 1 GPU", (*single, f"trainer=deepspeed_stage_{stage}",
                                                         "trainer.devices=1"), missing=no_deepspeed))
    if gpus >= 2:
        found.append(Case("tiny, DDP, 2 GPUs", (*single, "trainer=ddp", "trainer.devices=2")))
        for stage in (2, 3):
            found.append(Case(f"tiny, ZeRO-{stage}, 2 GPUs", (*single, f"trainer=deepspeed_stage_{stage}",
                                                              "trainer.devices=2"), missing=no_deepspeed))
        evaluated = (*EVALUATED_ON_FEWER_TASKS_THAN_RANKS, trainer, "rollout=vllm", "trainer.devices=2")
        found.append(Case("tiny, DDP + vLLM, 2 GPUs", (*evaluated, "trainer=ddp"), python=vllm or "",
                          missing=no_vllm, timeout_s=CASE_TIMEOUT_S + VLLM_STARTUP_S))
        found.append(Case("tiny, ZeRO-3 + vLLM, 2 GPUs", (*evaluated, "trainer=deepspeed_stage_3"), python=vllm or "",
                          missing=no_vllm or no_deepspeed, timeout_s=CASE_TIMEOUT_S + VLLM_STARTUP_S))
    return found


MEANS = ("perf/step_s", "perf/gen_s", "perf/gen_tokens_per_s", "perf/update_s", "perf/update_peak_share")
LARGEST = ("perf/peak_memory_gib", "perf/update_peak_memory_gib")


def figures(run_dir: Path) -> dict[str, float]:
    """The step's parts, generation tokens/s and the update's share of the matmul peak (means over the RL steps) and
    the peak GPU memory, of the step and of its update (the largest)."""
    rows = list(csv.DictReader((run_dir / "csv" / "metrics.csv").open()))

    def values(name: str) -> list[float]:
        return [float(row[name]) for row in rows if row.get(name)]

    found = {name: sum(values(name)) / len(values(name)) for name in MEANS if values(name)}
    return found | {name: max(values(name)) for name in LARGEST if values(name)}


def shaped_model(shape: Path, out: Path) -> Path:
    """The random-weight model of ``shape`` (a folder with a config.json), built under ``out`` on first use."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return build_shaped_model(shape, out / f"{shape.name}-random", device=device)


def against_estimate(result: Result, overrides: list[str], model: Path) -> Result:
    """``result`` with the doctor's estimate for the run's configuration, failed where the measured peak is more
    than :data:`ESTIMATE_TOLERANCE` off it (on a machine without CUDA nothing is measured to hold against it)."""
    cfg, _ = compose_run(overrides)
    capacity = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else ASSUMED_GPU_BYTES
    guess = estimate(Shape.from_dir(model), cfg, 1, capacity, on_gpu=True)
    result.figures["estimate_gib"] = estimated = guess.total / GIB
    result.note = f"estimate: {guess.describe()}"
    peak = result.figures.get("perf/peak_memory_gib")
    if peak is not None and abs(peak / estimated - 1) > ESTIMATE_TOLERANCE:
        result.status = "FAILED"
        result.note = f"peak {peak:.2f} GiB, {100 * (peak / estimated - 1):+.0f} % against the {result.note}: " \
                      f"more than {100 * ESTIMATE_TOLERANCE:.0f} % off"
    return result


ERROR_LINE = re.compile(r"^(error:|[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b)")


def error_line(output: str) -> str:
    """The line that says why a run failed: its last ``error:`` line or exception (Hydra's hint and NCCL's exit
    warnings follow it), else its last line."""
    lines = output.strip().splitlines() or [""]
    return next((line for line in reversed(lines) if ERROR_LINE.match(line)), lines[-1])


def vllm_problem(python: str | None) -> str | None:
    """Why vLLM cannot run here (one line naming the fix), or None: ``python`` is the Python that has vLLM
    (:func:`vllm_python`)."""
    if python is None:
        return "gpu-check: vLLM is not installed (no .venv-vllm): run `make setup-vllm`, then `make gpu-check` again"
    done = subprocess.run([python, "-c", "import vllm"], cwd=REPO, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        return f"gpu-check: vLLM does not import in {python}: {error_line(done.stdout + done.stderr)[:200]} " \
               "(rebuild it: rm -r .venv-vllm && make setup-vllm)"
    return None


def run_case(case: Case, out: Path, budget_s: float = float("inf")) -> Result:
    """Run ``case`` under its limit or, when less is left, ``budget_s``."""
    if case.missing:
        return Result(case, "missing", note=case.missing)
    if budget_s < 1:
        return Result(case, "FAILED", note=f"not run: the check's {CHECK_BUDGET_S} s budget was spent")
    timeout_s = min(case.timeout_s, budget_s)
    run_dir = out / "".join(c if c.isalnum() else "-" for c in case.name.lower())
    model = shaped_model(case.shape, out) if case.shape else None
    overrides = [*case.overrides, *([f"model.name_or_path={model}"] if model else []), f"hydra.run.dir={run_dir}"]
    command = [case.python, *case.command] if case.command else [case.python, "train.py", *overrides]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return Result(case, "FAILED", timeout_s, note=f"still running after {timeout_s:.0f} s")
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        why = error_line(done.stdout + done.stderr)[:150]
        return Result(case, "FAILED", seconds, note=f"exit {done.returncode}: {why}")
    if case.command:
        return Result(case, "passed", seconds, note=done.stdout.strip().splitlines()[-1])
    result = Result(case, "passed", seconds, figures(run_dir))
    return against_estimate(result, overrides, model) if model else result


COLUMNS = {"step s": ("perf/step_s", 2, 1), "gen s": ("perf/gen_s", 2, 1),
           "gen tokens/s": ("perf/gen_tokens_per_s", 0, 1), "update s": ("perf/update_s", 2, 1),
           "update % of matmul peak": ("perf/update_peak_share", 1, 100), "peak GiB": ("perf/peak_memory_gib", 2, 1),
           "update peak GiB": ("perf/update_peak_memory_gib", 2, 1), "estimate GiB": ("estimate_gib", 2, 1)}


def table(results: list[Result]) -> str:
    """A markdown table of the results (a run's figures: means over its RL steps; memory: the largest)."""
    lines = [f"| case | result | s | {' | '.join(COLUMNS)} | note |", "|---" * (len(COLUMNS) + 4) + "|"]
    for r in results:
        cells = [f"{r.figures[k] * scale:.{d}f}" if k in r.figures else "" for k, d, scale in COLUMNS.values()]
        lines.append(f"| {r.case.name} | {r.status} | {r.seconds:.0f} | {' | '.join(cells)} | {r.note} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "outputs" / "gpu-check"), help="where the runs write")
    parser.add_argument("--cases", nargs="+", metavar="TEXT", help="only the cases whose names contain one of these")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu-check: no CUDA device is visible on this machine (torch.cuda.is_available() is False): run it on a "
              "GPU machine; `python -m lightning_epo.doctor` checks this one")
        return 1
    problem = vllm_problem(vllm_python())
    if problem is not None:
        print(problem)
        return 1
    gpus = torch.cuda.device_count()
    print(f"gpu-check: {gpus} x {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    results, end = [], time.monotonic() + CHECK_BUDGET_S
    for case in cases(gpus):
        if args.cases and not any(text.lower() in case.name.lower() for text in args.cases):
            continue
        results.append(run_case(case, Path(args.out), budget_s=end - time.monotonic()))
        print(f"{results[-1].status:<7} {case.name} {results[-1].note}", flush=True)
    print(table(results))
    return 1 if any(r.status == "FAILED" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
