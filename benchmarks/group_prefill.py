"""The hf engine on a GRPO step's first turn: groups of identical prompts, one response sampled per row.

A GRPO step starts ``group_size`` rollouts of each task from the same observation, so its first turn sends every
prompt ``group_size`` times (and later turns repeat prompts while a group's actions agree). The engine prefills each
distinct prompt of a chunk once and copies its KV cache to the rows that share it; this script times
``HFEngine.generate`` on such a batch, to compare the engine at two commits (run it from each checkout):

    python benchmarks/group_prefill.py [--model data/smollm2-135m-instruct] [--groups 4] [--group-size 4]
        [--new-tokens 16] [--repeats 3]

Prompts: gridworld's first-turn prompts (the paper's template, SmolLM2's chat template) of the first ``--groups``
training tasks, each repeated ``--group-size`` times; sampling at temperature 1.0 with a fixed seed, so both
checkouts sample alike. Prints the prompt tokens, the median seconds of one ``generate`` call over ``--repeats``
(after one warm-up call), and generated tokens per second.
"""

from __future__ import annotations

import argparse
import time

import bench_utils  # noqa: F401 - puts the repository on sys.path
import torch
from bench_utils import REPO_ROOT, machine_line, median
from transformers import AutoModelForCausalLM, AutoTokenizer

from lightning_epo.envs.gridworld import GridworldSuite
from lightning_epo.rollout.engine import SamplingParams
from lightning_epo.rollout.hf_engine import HFEngine
from lightning_epo.rollout.prompts import PromptBuilder, chat_token_ids


def first_turn_prompts(tokenizer: AutoTokenizer, groups: int, group_size: int) -> list[list[int]]:
    """Token ids of the first ``groups`` training tasks' first-turn prompts, each ``group_size`` times in a row."""
    suite, builder = GridworldSuite(), PromptBuilder("gridworld")
    prompts = []
    for task in suite.tasks("train")[:groups]:
        observation, info = suite.make_env().reset(task)
        text = builder.text(info.get("task", task.name), observation, None, [], 0)
        prompts += [chat_token_ids(tokenizer, builder.messages(text))] * group_size
    return prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(REPO_ROOT / "data" / "smollm2-135m-instruct"))
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    engine = HFEngine(tokenizer, AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32))
    prompts = first_turn_prompts(tokenizer, args.groups, args.group_size)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens)
    seconds, tokens = [], []
    for repeat in range(args.repeats + 1):  # the first call warms up
        torch.manual_seed(repeat)
        start = time.perf_counter()
        generations = engine.generate(prompts, sampling)
        if repeat:
            seconds.append(time.perf_counter() - start)
            tokens.append(sum(len(g.token_ids) for g in generations))
    print(machine_line())
    print(f"{len(prompts)} prompts ({args.groups} distinct), {sum(map(len, prompts))} prompt tokens")
    print(f"generate_s {median(seconds):.3f} (min {min(seconds):.3f}, max {max(seconds):.3f}); "
          f"{median(tokens) / median(seconds):.1f} generated tokens/s")


if __name__ == "__main__":
    main()
