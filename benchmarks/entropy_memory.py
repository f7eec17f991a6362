"""Peak memory of ``token_logprobs_and_entropy`` (as the trainer calls it), forward and backward, on Qwen2.5's 151936-token
vocabulary, with and without ``chunk_size``, and the largest number of response tokens per micro-batch
whose logits fit a memory budget.

Each measurement runs in a fresh subprocess (torch's CPU allocations are invisible to tracemalloc): it
builds float32 logits ``[T, V]``, resets the kernel's peak-RSS mark (``/proc/self/clear_refs``), runs
forward + backward of ``sum(w1 * log p) + sum(w2 * H)`` and reads the peak (``VmHWM``). Reported:
``extra`` = peak minus the RSS with the logits already allocated (the functions' working memory, the
logits' gradient included) and ``total`` = logits + extra, the figure compared to the budget.

The largest fitting T: the total is linear in T, so it is fitted through the two table sizes, solved for
the budget and then checked in subprocesses (the solution fits; 5% more does not).

    python benchmarks/entropy_memory.py [--quick] [--budget-mib 2048]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import bench_utils  # noqa: F401 - puts the repository on sys.path
import torch
from bench_utils import machine_line, print_table

VOCAB = 151936
MIB = 2**20


def _status_kib(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field} line: this benchmark needs Linux")


def worker(tokens: int, chunk: int | None) -> dict[str, float]:
    """Runs in the subprocess: memory (MiB) and CPU seconds of one forward + backward."""
    from lightning_epo.algos.entropy import token_logprobs_and_entropy

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(tokens, VOCAB, generator=g) * 2).requires_grad_()
    labels = torch.randint(0, VOCAB, (tokens,), generator=g)
    w1, w2 = torch.randn(tokens, generator=g), torch.randn(tokens, generator=g)
    rss_with_logits = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:  # reset VmHWM to the current RSS
        f.write("5")
    start = time.process_time()
    logprob, entropy = token_logprobs_and_entropy(logits, labels, chunk)
    loss = (logprob * w1).sum() + (entropy * w2).sum()
    loss.backward()
    seconds = time.process_time() - start
    extra = (_status_kib("VmHWM") - rss_with_logits) / 1024
    logits_mib = logits.numel() * logits.element_size() / MIB
    return {"tokens": tokens, "logits_mib": logits_mib, "extra_mib": extra, "total_mib": logits_mib + extra,
            "cpu_s": seconds}


def run(tokens: int, chunk: int | None) -> dict[str, float]:
    """``worker`` in a fresh Python process."""
    cmd = [sys.executable, __file__, "--worker", str(tokens), str(chunk or 0)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"worker {tokens} tokens, chunk {chunk} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def largest_fitting(chunk: int | None, budget_mib: float, a: dict, b: dict) -> tuple[int, dict, dict]:
    """Largest T whose total fits ``budget_mib``: linear fit through the measurements ``a`` and ``b`` (two sizes),
    then checked at T (stepping down while it does not fit) and at 1.05 T."""
    slope = (b["total_mib"] - a["total_mib"]) / (b["tokens"] - a["tokens"])
    tokens = int((budget_mib - (a["total_mib"] - slope * a["tokens"])) / slope)
    fits = run(tokens, chunk)
    while fits["total_mib"] > budget_mib:  # the fit was optimistic: step down until it really fits
        tokens = int(tokens * 0.97)
        fits = run(tokens, chunk)
    over = run(int(tokens * 1.05) + 1, chunk)
    return tokens, fits, over


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and a 512 MiB budget (about a minute)")
    parser.add_argument("--budget-mib", type=float, help="memory budget for the logits' part (default 2048; quick 512)")
    parser.add_argument("--worker", nargs=2, type=int, metavar=("TOKENS", "CHUNK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], args.worker[1] or None)))
        return
    budget = args.budget_mib or (512.0 if args.quick else 2048.0)
    sizes = [128, 256] if args.quick else [256, 1024]
    chunks: list[int | None] = [None, 64] if args.quick else [None, 1024, 128]
    torch.set_num_threads(1)  # as in the workers
    print(machine_line())
    print(f"\nPeak memory of token_logprobs_and_entropy, forward + backward, float32 logits [T, {VOCAB}]; "
          "CPU time with one thread")
    rows, measured = [], {}
    for tokens in sizes:
        for chunk in chunks:
            r = measured[tokens, chunk] = run(tokens, chunk)
            rows.append([tokens, chunk or "none", r["logits_mib"], r["extra_mib"], r["extra_mib"] / r["logits_mib"],
                         r["total_mib"], r["cpu_s"]])
    print_table(["T", "chunk_size", "logits MiB", "extra MiB", "extra / logits", "total MiB", "CPU s"], rows)

    print(f"\nLargest T (response tokens per micro-batch) whose logits part fits {budget:.0f} MiB")
    rows = []
    for chunk in chunks:
        tokens, fits, over = largest_fitting(chunk, budget, measured[sizes[0], chunk], measured[sizes[-1], chunk])
        rows.append([chunk or "none", tokens, fits["total_mib"], over["tokens"], over["total_mib"]])
    print_table(["chunk_size", "largest T", "total MiB at T", "T + 5%", "total MiB at T + 5%"], rows)


if __name__ == "__main__":
    main()
