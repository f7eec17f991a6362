"""The hf engine on one turn's prompts: a GRPO step's first turn (groups of identical prompts) or an evaluation's.

A GRPO step starts ``group_size`` rollouts of each task from the same observation, so its first turn sends every
prompt ``group_size`` times (and later turns repeat prompts while a group's actions agree). The engine prefills each
distinct prompt of a chunk once and copies its KV cache to the rows that share it, and prefills rows of very
different lengths in separate forwards rather than padding them all to the longest; this script times
``HFEngine.generate`` on such a batch, to compare the engine at two commits (run it from each checkout):

    python benchmarks/group_prefill.py [--env gridworld|alfworld] [--model data/smollm2-135m-instruct]
        [--groups 4] [--group-size 4] [--new-tokens 16] [--repeats 3]

Prompts: the first-turn prompts (the paper's template, SmolLM2's chat template) of ``--groups`` tasks, each repeated
``--group-size`` times: gridworld's first training tasks (prompts of equal length), or ALFWorld's evaluation games
(valid_seen, round-robin over task types as an evaluation picks them; ``data/alfworld``), whose admissible-action
lists make prompts of 300-900 tokens. Sampling at temperature 1.0 with a fixed seed, so both checkouts sample alike.
Prints the prompt tokens, the median seconds of one ``generate`` call over ``--repeats`` (after one warm-up call),
and generated tokens per second.
"""

from __future__ import annotations

import argparse
import time

import bench_utils  # noqa: F401 - puts the repository on sys.path
import torch
from bench_utils import REPO_ROOT, machine_line, median
from transformers import AutoModelForCausalLM, AutoTokenizer

from lightning_epo.envs.alfworld import AlfWorldSuite
from lightning_epo.envs.gridworld import GridworldSuite
from lightning_epo.rollout.datamodule import validation_sample
from lightning_epo.rollout.engine import SamplingParams
from lightning_epo.rollout.hf_engine import HFEngine
from lightning_epo.rollout.prompts import PromptBuilder, chat_token_ids


def first_turn_prompts(tokenizer: AutoTokenizer, env: str, groups: int, group_size: int) -> list[list[int]]:
    """Token ids of ``groups`` tasks' first-turn prompts, each ``group_size`` times in a row."""
    if env == "gridworld":
        suite = GridworldSuite()
        tasks = suite.tasks("train")[:groups]
    else:
        suite = AlfWorldSuite()
        tasks = validation_sample(suite.tasks("iid"), groups, seed=0)
    builder, environment, prompts = PromptBuilder(env), suite.make_env(), []
    for task in tasks:
        observation, info = environment.reset(task)
        text = builder.text(info.get("task", task.name), observation, info.get("admissible_actions"), [], 0)
        prompts += [chat_token_ids(tokenizer, builder.messages(text))] * group_size
    environment.close()
    return prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", choices=["gridworld", "alfworld"], default="gridworld")
    parser.add_argument("--model", default=str(REPO_ROOT / "data" / "smollm2-135m-instruct"))
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    engine = HFEngine(tokenizer, AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32))
    prompts = first_turn_prompts(tokenizer, args.env, args.groups, args.group_size)
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
    lengths = sorted({len(p) for p in prompts})
    print(f"{args.env}: {len(prompts)} prompts ({args.groups} distinct), {sum(map(len, prompts))} prompt tokens "
          f"({lengths[0]}-{lengths[-1]} a prompt)")
    print(f"generate_s {median(seconds):.3f} (min {min(seconds):.3f}, max {max(seconds):.3f}); "
          f"{median(tokens) / median(seconds):.1f} generated tokens/s")


if __name__ == "__main__":
    main()
