"""Does the colocated vLLM engine's host memory grow with its weight pushes? The resident size after each push and
generation, with no trainer beside it.

    .venv-vllm/bin/python benchmarks/engine_memory.py                                  # the tiny model, float32
    .venv-vllm/bin/python benchmarks/engine_memory.py --model-path data/smollm2-135m-instruct --dtype bfloat16

Steps: load the actor with transformers, start the VLLMEngine (as rollout=vllm does), then ``--pushes`` times: move
every weight a little (as an update would), push (``sync_weights``: the in-place reload and the prefix cache's
reset), generate ``--prompts`` responses to prompts of ``--prompt-tokens`` tokens. Prints the machine and a table:
the resident size (Linux's /proc/self/statm) after each push and each generation, and the push's seconds. A flat
column is an engine that does not grow; docs/real_model.md, "ScienceWorld", has the SmolLM2 figures.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a plain script
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.bench_utils import machine_line, print_table  # noqa: E402
from lightning_epo.models.loading import load_actor, load_tokenizer  # noqa: E402
from lightning_epo.rollout.engine import SamplingParams  # noqa: E402
from lightning_epo.rollout.vllm_engine import VLLMEngine  # noqa: E402
from lightning_epo.training.host_memory import resident_gib  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-path", default=str(REPO_ROOT / "data" / "tiny_gridworld"))
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--pushes", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    args = parser.parse_args()
    print(machine_line())
    model = {"name_or_path": args.model_path}
    tokenizer, actor = load_tokenizer(model), load_actor(model)
    engine = VLLMEngine(tokenizer, model, dtype=args.dtype, seed=0)
    vocab = actor.get_input_embeddings().num_embeddings
    prompts = [[(7 * i + t) % vocab for t in range(args.prompt_tokens)] for i in range(args.prompts)]
    sampling = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=32)
    rows = [["start", "", f"{resident_gib():.2f}", ""]]
    for push in range(args.pushes):
        with torch.no_grad():
            for param in actor.parameters():
                param.add_(torch.randn_like(param) * 1e-4)
        began = time.perf_counter()
        engine.sync_weights(actor)
        seconds, after_push = time.perf_counter() - began, resident_gib()
        engine.generate(prompts, sampling)
        rows.append([push, f"{seconds:.2f}", f"{after_push:.2f}", f"{resident_gib():.2f}"])
    engine.close()
    print_table(["push", "push s", "resident after push, GiB", "after generation, GiB"], rows)


if __name__ == "__main__":
    main()
