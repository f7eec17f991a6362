"""The actor's update with LoRA adapters on every decoder layer against adapters on the top N only
(``model.lora.top_layers``), on rows the size of a ScienceWorld turn.

    python benchmarks/lora_top_layers.py [--model data/smollm2-135m-instruct] [--rows 4] [--prompt 494]
        [--response 12] [--top 15 10 6] [--repeats 3] [--precision 32|bf16]

Each arm runs the update as the SmolLM2 recipes do (LoRA r 16, alpha 32, every linear layer; the output layer on the
response positions only, a backward pass to the adapters: ``bench_utils.lora_actor_update``) on the same rows;
``--prompt 494`` and ``--response 12`` are a history-2 turn's positions in the update (506 a row on gold paths:
benchmarks/sciworld_prompt_tokens.py). ``bf16`` runs it under bf16 autocast, as ``bf16-mixed`` does. Reported per
arm: the median process CPU time on one torch thread over ``--repeats`` (after one warm-up; the arms' order reversed
on every other repeat) and its share of the every-layer arm's. A forward pass without gradients is timed beside them
(F; the every-layer update T): the share predicted for the top N of L layers is ``(F + (T - F) N / L) / T``, the
backward pass's time spread evenly over the layers.
"""

from __future__ import annotations

import argparse
import contextlib

import bench_utils  # noqa: F401 - puts the repository on sys.path
import torch
from bench_utils import (RECIPE_LORA, REPO_ROOT, cpu_seconds, lora_actor_update, machine_line, median,
                         print_table)

from lightning_epo.models.loading import load_actor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(REPO_ROOT / "data" / "smollm2-135m-instruct"))
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=494, help="prompt positions a row")
    parser.add_argument("--response", type=int, default=12, help="response tokens a row (a gold answer: 11.6)")
    parser.add_argument("--top", type=int, nargs="+", default=[15, 10, 6], help="model.lora.top_layers arms")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--precision", choices=["32", "bf16"], default="32")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = {"name_or_path": args.model, "dtype": "float32", "attn_implementation": "sdpa"}
    actors = {"every layer": load_actor({**cfg, "lora": RECIPE_LORA}).train()}
    layers = actors["every layer"].config.num_hidden_layers
    actors |= {f"top {n} (model.lora.top_layers={n})":
               load_actor({**cfg, "lora": {**RECIPE_LORA, "top_layers": n}}).train() for n in args.top}
    ids = torch.randint(0, actors["every layer"].config.vocab_size, (args.rows, args.prompt + args.response))
    mask = torch.ones_like(ids)

    def autocast():
        return torch.autocast("cpu", dtype=torch.bfloat16) if args.precision == "bf16" else contextlib.nullcontext()

    def update(actor) -> None:
        with autocast():
            lora_actor_update(actor, ids, mask, args.response)

    def forward_only() -> None:
        with torch.no_grad(), autocast():
            actors["every layer"](input_ids=ids, attention_mask=mask, logits_to_keep=args.response + 1)

    arms = {name: (lambda actor=actor: update(actor)) for name, actor in actors.items()}
    arms["forward only"] = forward_only
    for run in arms.values():
        run()  # warm-up
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    for repeat in range(args.repeats):
        for name in (list(arms) if repeat % 2 == 0 else list(reversed(arms))):
            seconds[name].append(cpu_seconds(arms[name]))
    every = median(seconds["every layer"])
    forward = median(seconds["forward only"])
    predicted = {"every layer": 1.0, "forward only": None} | {
        f"top {n} (model.lora.top_layers={n})": (forward + (every - forward) * n / layers) / every for n in args.top}
    print(machine_line())
    print(f"model {args.model} ({layers} decoder layers); {args.rows} rows of {args.prompt} + {args.response} tokens; "
          f"precision {args.precision}; one torch thread; {args.repeats} repeats\n")
    print_table(["adapters", "CPU s (median)", "share of every layer", "predicted share"],
                [[name, median(s), median(s) / every, "-" if predicted[name] is None else predicted[name]]
                 for name, s in seconds.items()])


if __name__ == "__main__":
    main()
