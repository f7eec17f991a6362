"""The critic's cost against the actor's update, per critic kind, on rows the size of a ScienceWorld turn.

    python benchmarks/critic_cost.py [--model data/smollm2-135m-instruct] [--rows 4] [--prompt 624] [--response 12]
        [--layers 3 4 6] [--repeats 1]

The actor is the model with LoRA adapters (r 16, alpha 32, every linear layer: the SmolLM2 recipes'), trained as the
update trains it: a forward pass with the output layer on the response positions only and a backward pass to the
adapters. Each critic (``ValueModel``, lightning_epo/models/critic.py) runs what an RL step asks of it: the values
pass before the update (a forward without gradients) and a forward and backward in the update. Critics: the whole
model trained in full (what ``algo=ppo`` ships), the whole model with LoRA adapters (``model.lora.critic=true``),
and the model's first N decoder layers trained in full (``model.critic_layers=N``). Time is process CPU time on one
torch thread (on a shared machine wall time counts the other jobs too), the median over ``--repeats`` after one
warm-up; the share is the critic's time over the actor's.
"""

from __future__ import annotations

import argparse
import statistics

import bench_utils  # noqa: F401 - puts the repository on sys.path
import torch
from bench_utils import RECIPE_LORA, REPO_ROOT, cpu_seconds, lora_actor_update

from lightning_epo.models.loading import load_actor, load_critic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(REPO_ROOT / "data" / "smollm2-135m-instruct"))
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=624, help="prompt tokens a row (the recipe's mean: 636 in all)")
    parser.add_argument("--response", type=int, default=12, help="response tokens a row (a gold answer: 11.6)")
    parser.add_argument("--layers", type=int, nargs="+", default=[3, 4, 6])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = {"name_or_path": args.model, "dtype": "float32", "attn_implementation": "sdpa", "lora": RECIPE_LORA}
    length = args.prompt + args.response
    vocab = load_actor({**cfg, "lora": None}).config.vocab_size
    ids = torch.randint(0, vocab, (args.rows, length))
    mask = torch.ones_like(ids)

    actor = load_actor(cfg).train()

    def actor_update() -> None:
        lora_actor_update(actor, ids, mask, args.response)

    critics = {"whole, trained in full": {**cfg, "lora": {**RECIPE_LORA, "r": None}},
               "whole, LoRA (model.lora.critic=true)": {**cfg, "lora": {**RECIPE_LORA, "critic": True}}}
    critics |= {f"first {n} layers, in full (model.critic_layers={n})":
                {**cfg, "lora": {**RECIPE_LORA, "r": None}, "critic_layers": n} for n in args.layers}
    actor_update()  # warm-up
    actor_s = statistics.median(cpu_seconds(actor_update) for _ in range(args.repeats))
    tokens = args.rows * length
    print(f"model {args.model}; {args.rows} rows of {args.prompt} + {args.response} tokens; one torch thread\n")
    print("| model | values pass (s) | update fwd+bwd (s) | critic's total (s) | share of the actor's update |")
    print("|---|---|---|---|---|")
    print(f"| actor, LoRA r 16 (update) | - | {actor_s:.1f} | - | 1.00 |")
    for name, model_cfg in critics.items():
        critic = load_critic({**model_cfg, "lora": model_cfg["lora"] if model_cfg["lora"]["r"] else None}).train()

        def values_pass() -> None:
            with torch.no_grad():
                critic(ids, mask)

        def update() -> None:
            critic(ids, mask)[:, -args.response:].pow(2).mean().backward()

        update()  # warm-up
        values_s = statistics.median(cpu_seconds(values_pass) for _ in range(args.repeats))
        update_s = statistics.median(cpu_seconds(update) for _ in range(args.repeats))
        print(f"| critic: {name} | {values_s:.1f} | {update_s:.1f} | {values_s + update_s:.1f} | "
              f"{(values_s + update_s) / actor_s:.2f} |")
        del critic
    print(f"\n{tokens} tokens a pass; actor update {tokens / actor_s:.0f} tokens/s")


if __name__ == "__main__":
    main()
