"""The update's decoder pass on CPU by attention implementation (``model.attn_implementation``) and precision.

What the trainer's update runs on a micro-batch of gridworld turns: SmolLM2 (``--model``, `make smollm2`) with LoRA
r 16 on every linear layer, the rows' common prefix computed once (``model.shared_prefix``: the rows' pass reads
the prefix's keys and values, so attention gets an explicit mask), right padding, the output layer on each row's
last ``--response`` positions, then backward. Arms: ``sdpa`` and ``eager`` attention, each in float32 and under bf16
autocast (``trainer.precision=bf16-mixed``), run in turn in one process (the arms' order reversed on every other
repeat), so the machine's drift between minutes falls on all arms alike. Prints the median seconds of one forward
and backward per arm, its ratio to float32 sdpa's, each arm's loss against float32 sdpa's (the arms compute
the same loss, to bf16 rounding), and the process's peak resident memory during the arm's pass (Linux: the peak is
reset before each pass, ``/proc/self/clear_refs``; the model's 0.5 GB included). Memory an earlier arm freed stays
with the process and counts in a later arm's peak: for each arm's own peak run one arm a process (``--arms``).

    python benchmarks/attention_cpu.py [--rows 24] [--length 170] [--prefix 65] [--response 12] [--repeats 3]
    python benchmarks/attention_cpu.py --rows 5 --length 1000 --prefix 244 --repeats 1 --arms eager:bf16
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import bench_utils  # noqa: F401 - puts the repository on sys.path
import torch
from bench_utils import REPO_ROOT, machine_line, median, print_table
from transformers import AutoModelForCausalLM

from lightning_epo.models.lora import add_lora
from lightning_epo.models.shared_prefix import Sharing, decoder_hidden_states
from lightning_epo.runtime.config import cpu_computes_bf16

LORA = {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear"}
ARMS = [("sdpa", False), ("eager", False), ("sdpa", True), ("eager", True)]  # (attention, bf16 autocast)


def label(arm: tuple[str, bool]) -> str:
    """``sdpa:fp32``, ``eager:bf16``, ...: an arm as ``--arms`` names it."""
    return f"{arm[0]}:{'bf16' if arm[1] else 'fp32'}"


def micro_batch(rows: int, length: int, prefix: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids, attention_mask [rows, length]``: a common ``prefix``, then random tokens, right-padded by 0-11."""
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, vocab, (rows, length), generator=generator)
    input_ids[:, :prefix] = input_ids[0, :prefix]
    attention_mask = torch.ones(rows, length, dtype=torch.long)
    for row in range(rows):
        attention_mask[row, length - row % 12:] = 0
    return input_ids, attention_mask


def forward_backward(model, input_ids, attention_mask, prefix: int, response: int, bf16: bool) -> float:
    """One forward (decoder with the shared prefix, output layer on each row's last ``response`` real tokens) and
    backward; returns the loss (the mean log-normaliser of those positions' logits)."""
    causal_lm = model.base_model.model
    lengths = attention_mask.sum(-1, keepdim=True)
    positions = torch.arange(input_ids.shape[1])
    answer = (positions >= lengths - response) & (positions < lengths)  # [rows, length]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        hidden = decoder_hidden_states(causal_lm.model, input_ids, attention_mask, Sharing(prefix=prefix))
        logits = causal_lm.lm_head(hidden[answer])
    loss = logits.float().logsumexp(-1).mean()
    loss.backward()
    model.zero_grad(set_to_none=True)
    return loss.item()


def peak_resident_gb(reset: bool = False) -> float:
    """The process's peak resident memory so far in GB (``VmHWM``); with ``reset``, start a new peak first."""
    if reset:
        Path("/proc/self/clear_refs").write_text("5")
    status = Path("/proc/self/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(REPO_ROOT / "data" / "smollm2-135m-instruct"))
    parser.add_argument("--rows", type=int, default=24)
    parser.add_argument("--length", type=int, default=170)
    parser.add_argument("--prefix", type=int, default=65)
    parser.add_argument("--response", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--arms", nargs="+", choices=[label(arm) for arm in ARMS],
                        help="only these arms (attention:precision); float32 sdpa first when it is among them")
    args = parser.parse_args()
    arms = [arm for arm in ARMS if args.arms is None or label(arm) in args.arms]
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = add_lora(AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32), LORA, "CAUSAL_LM")
    input_ids, attention_mask = micro_batch(args.rows, args.length, args.prefix, model.config.vocab_size)

    peaks: dict[tuple[str, bool], float] = {}

    def run(arm: tuple[str, bool]) -> tuple[float, float]:
        model.base_model.model.set_attn_implementation(arm[0])
        peak_resident_gb(reset=True)
        start = time.perf_counter()
        loss = forward_backward(model, input_ids, attention_mask, args.prefix, args.response, arm[1])
        peaks[arm] = max(peaks.get(arm, 0.0), peak_resident_gb())
        return time.perf_counter() - start, loss

    losses = {arm: run(arm)[1] for arm in arms}  # warm-up
    seconds: dict[tuple[str, bool], list[float]] = {arm: [] for arm in arms}
    for repeat in range(args.repeats):
        for arm in arms if repeat % 2 == 0 else arms[::-1]:
            seconds[arm].append(run(arm)[0])
    print(machine_line())
    print(f"bf16 native on this CPU: {cpu_computes_bf16()}; {args.rows} rows of {args.length} tokens, prefix "
          f"{args.prefix}, {args.repeats} repeats")
    base = median(seconds[arms[0]])
    print_table(["attention", "precision", "forward + backward (s), median", "runs", f"{label(arms[0])} / arm",
                 "loss - first arm's", "peak resident (GB)"],
                [[attention, "bf16 autocast" if bf16 else "float32", round(median(ts), 2),
                  ", ".join(f"{t:.2f}" for t in ts), round(base / median(ts), 2),
                  f"{losses[(attention, bf16)] - losses[arms[0]]:.1e}", round(peaks[(attention, bf16)], 2)]
                 for (attention, bf16), ts in seconds.items()])


if __name__ == "__main__":
    main()
