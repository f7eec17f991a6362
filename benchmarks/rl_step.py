"""Whole RL steps as a user runs them: the plain configuration against the defaults, part by part.

Each arm is ``train.py`` with a fixed recipe (same tasks, same seed: the first step's rollout is the same episodes in
both arms), read back from its ``metrics.csv``: the step's ``perf/*`` parts (generation, environment, old-policy
log-probs, values, reference, update, weight push; lightning_epo/training/step_clock.py) and ``perf/step_s``, the
step timed whole. Process start and model loading are not part of a step and are not counted; no evaluation runs.

- ``plain``: every exact speed switch off (``algo.micro_batch_tokens=null algo.micro_batch_size=16
  model.shared_prefix=false model.fold_turns=false``), float32: the defaults until 2026-11-25, but for the old-policy
  pass, which since 2026-11-26 leaves the actor's outputs of the first mini-batch to the update's own forward in
  every arm (exact, not a switch: RESULTS.md section 8 measures it against the code before);
- ``defaults``: the configuration as shipped (for the two recipes' models: micro-batches cut by a 4096-token budget,
  the rows' common prompt prefix computed once, earlier turns read from later ones): the same values and gradients
  to float32 rounding (tests/training/test_shared_prefix_update.py, tests/training/test_micro_batch_tokens.py);
- ``tokens``, ``sharing`` (``--arms``): the token budget alone, the prefix and the folded turns alone (16-row
  micro-batches), to see what each part of the defaults gives.

Recipes (``--model``): ``smollm2``, SmolLM2-135M-Instruct (``make smollm2``) on gridworld with PPO+EPO (actor and
critic trained in full, float32), 8 episodes of at most 4 turns a step (4 with ``--quick``), 24-token answers; ``tiny``, the default run's
model (``model=tiny_gridworld``) with ``experiment=gridworld_learn``'s batch (32 episodes) and update (2 PPO epochs of 4
mini-batches). ``--model-path`` points the smollm2 recipe at another model of that family (e.g. one with random
weights of the same shape, where the real weights cannot travel).

Arms alternate (plain, defaults, defaults, plain, ...); every figure is the median over the arm's steps and repeats.
The last line, ``rl_step_ratio X``, is the first recipe's whole step: the last arm / the first (defaults / plain).

    python benchmarks/rl_step.py [--quick] [--model smollm2 tiny] [--steps 2] [--repeats 2] [--device cpu|gpu]
        [--arms plain defaults tokens sharing] [KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bench_utils  # noqa: F401 - puts the repository on sys.path
from bench_utils import REPO_ROOT, machine_line, median, print_table

ROWS = ("algo.micro_batch_tokens=null", "algo.micro_batch_size=16")
ARMS = {
    "plain": (*ROWS, "model.shared_prefix=false", "model.fold_turns=false"),
    "defaults": (),
    "tokens": ("model.shared_prefix=false", "model.fold_turns=false"),
    "sharing": (*ROWS, "model.shared_prefix=true", "model.fold_turns=true"),
}
RECIPES = {
    "smollm2": ("model=smollm2-135m", "~experiment", "algo=ppo_epo", "data.episodes_per_step=8", "env.max_turns=4",
                "rollout.max_new_tokens=24"),
    "tiny": ("experiment=gridworld_learn", "warm_start=null", "algo.target_kl=null"),
}
PARTS = ("step", "rollout", "gen", "env", "old_logprob", "values", "ref_logprob", "update", "weight_sync")
RUN = ("+trainer.limit_val_batches=0", "val_at_start=false", "logger=csv", "~callbacks.progress_bar", "seed=0")
QUICK = {"smollm2": ("data.episodes_per_step=4",), "tiny": ()}  # --quick: fewer episodes, one step, once


def run_arm(recipe: tuple[str, ...], arm: tuple[str, ...], steps: int, out: Path, device: str) -> list[dict]:
    """One ``train.py`` run of ``steps`` RL steps; its steps' ``perf/*`` rows of ``metrics.csv``."""
    trainer = ("trainer=gpu",) if device == "gpu" else ()
    command = [sys.executable, "train.py", *recipe, *arm, *RUN, *trainer, f"total_steps={steps}", f"hydra.run.dir={out}"]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"rl_step: {' '.join(command)} failed:\n{done.stderr[-3000:]}")
    rows = csv.DictReader((out / "csv" / "metrics.csv").open())
    return [{k: float(v) for k, v in row.items() if v} for row in rows if row.get("perf/step_s")]


def compare(name: str, recipe: tuple[str, ...], steps: int, repeats: int, device: str, extra: tuple[str, ...],
            arms: list[str]) -> float:
    """Run every arm ``repeats`` times, print the table of parts; the whole step's ratio, last arm / plain."""
    found: dict[str, list[dict]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(repeats):
            order = arms if repeat % 2 == 0 else arms[::-1]
            for arm in order:
                began = time.perf_counter()
                rows = run_arm((*recipe, *extra), ARMS[arm], steps, Path(tmp) / f"{arm}{repeat}", device)
                found[arm].extend(rows)
                print(f"# {name} {arm} repeat {repeat}: {len(rows)} steps, run {time.perf_counter() - began:.0f} s",
                      flush=True)
    table = []
    for part in PARTS:
        key = f"perf/{part}_s"
        if all(key in row for rows in found.values() for row in rows):
            times = [median([row[key] for row in found[arm]]) for arm in arms]
            table.append([part, *(f"{t:.2f}" for t in times),
                          *(f"{t / times[0]:.3f}" if times[0] > 0 else "" for t in times[1:])])
    rates = [median([row["perf/update_flops_per_s"] for row in found[arm]]) / 1e9 for arm in arms]
    table.append(["update GFLOP/s", *(f"{r:.1f}" for r in rates), *(f"{r / rates[0]:.3f}" for r in rates[1:])])
    print(f"\n{name}: {' '.join(recipe)} {' '.join(extra)}, {steps} steps x {repeats} repeats per arm\n")
    print_table(["part", *(f"{arm} s" for arm in arms), *(f"{arm} / {arms[0]}" for arm in arms[1:])], table)
    whole = [median([row["perf/step_s"] for row in found[arm]]) for arm in arms]
    return whole[-1] / whole[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one step per arm, once: under 10 minutes on 2 cores")
    parser.add_argument("--model", nargs="+", choices=tuple(RECIPES), default=list(RECIPES))
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--model-path", help="model.name_or_path for the smollm2 recipe")
    parser.add_argument("--arms", nargs="+", choices=tuple(ARMS), default=["plain", "defaults"],
                        help="the first is the baseline of the ratios")
    parser.add_argument("overrides", nargs="*", help="more train.py overrides for both arms (e.g. torch_threads=2)")
    args = parser.parse_args()
    steps, repeats = (1, 1) if args.quick else (args.steps, args.repeats)
    print(machine_line())
    ratios = []
    for name in args.model:
        extra = (f"model.name_or_path={args.model_path}",) if name == "smollm2" and args.model_path else ()
        extra += (*(QUICK[name] if args.quick else ()), *args.overrides)
        ratios.append(compare(name, RECIPES[name], steps, repeats, args.device, extra, args.arms))
    print(f"rl_step_ratio {ratios[0]:.3f}")


if __name__ == "__main__":
    main()
