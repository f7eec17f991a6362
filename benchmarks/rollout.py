"""Rollout throughput on gridworld and where an RL step's time goes.

1. Environment steps per second and generated tokens per second by pool kind (in-process ``SyncEnvPool``,
   one process per slot ``ProcessEnvPool``) and pool size (1, 2, 4), with the project's tiny model in the
   HF engine (``rollout=hf``) and with the environment's expert (``rollout=expert``: every turn is an
   environment step, so it shows the pools' own throughput). The random tiny model rarely writes a
   parsable ``<action>``, and a turn without one sends nothing to the environment, so its env-steps
   columns are mostly empty: ``--model`` takes a trained policy instead (e.g. a gridworld_learn run's
   ``warm_start/policy``), whose turns do step the environments. ``env steps/s`` = env_steps / env_s and
   ``gen tok/s`` = gen_tokens / gen_s (the collector's ``Rollout.stats``, as ``perf/*`` logs them);
   ``turns/s`` = agent turns / wall time of ``collect``. Pool start-up is not timed (one warm-up collect first).
2. The share of one RL step spent in environments, generation, the rest of the rollout (prompts,
   tokenisation, parsing), and the update (old-policy pass + one PPO+EPO optimizer step of the actor,
   the project's functions, see ``epo_overhead.py``).

Wall-clock medians over repeats (other processes share this machine: see the load in the first line).

    python benchmarks/rollout.py [--quick] [--model RUN/warm_start/policy]

The top level imports only light modules: ``ProcessEnvPool`` spawns workers that re-import this file.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench_utils import REPO_ROOT, machine_line, median, print_table

from lightning_epo.envs.gridworld import GridworldSuite
from lightning_epo.envs.process_pool import ProcessEnvPool
from lightning_epo.envs.sync_pool import SyncEnvPool

POOLS = {"sync": SyncEnvPool, "process": ProcessEnvPool}


def collect(collector: Any, tasks: list, sampling: Any) -> tuple[Any, float]:
    """``collector.collect`` of ``tasks`` and its wall time."""
    start = time.perf_counter()
    rollout = collector.collect(tasks, list(range(len(tasks))), sampling)
    return rollout, time.perf_counter() - start


def throughput_rows(engines: dict[str, tuple[Any, list, int]], tokenizer: Any, suite: GridworldSuite,
                    sizes: list[int], repeats: int, sampling: Any) -> list[list[object]]:
    """One row per (pool kind, size, engine): median env steps/s, gen tokens/s, turns/s and collect time.
    ``engines`` maps a name to ``(engine, tasks, max_turns)``."""
    from lightning_epo.rollout.collector import EpisodeCollector
    from lightning_epo.rollout.prompts import PromptBuilder

    rows = []
    for pool_name, pool_cls in POOLS.items():
        for size in sizes:
            pool = pool_cls(suite, size)
            try:
                for engine_name, (engine, tasks, max_turns) in engines.items():
                    prompts = PromptBuilder("gridworld", 2, think=False)  # conf/rollout/hf.yaml: think false
                    collector = EpisodeCollector(pool, engine, tokenizer, prompts, max_turns)
                    collect(collector, tasks[:size], sampling)  # warm-up: worker processes, first forward passes
                    runs = [collect(collector, tasks, sampling) for _ in range(repeats)]
                    stats = [r.stats for r, _ in runs]
                    turns = [sum(ep.num_turns for ep in r.episodes) for r, _ in runs]
                    rows.append([
                        engine_name, pool_name, size, len(tasks),
                        median([s["env_steps"] for s in stats]),
                        median([s["env_steps"] / s["env_s"] if s["env_steps"] else 0.0 for s in stats]),
                        median([s["gen_tokens"] / s["gen_s"] for s in stats]),
                        median([t / wall for t, (_, wall) in zip(turns, runs)]),
                        median([wall for _, wall in runs]),
                    ])
            finally:
                pool.close()
    return sorted(rows, key=lambda r: (not r[0].startswith("hf"), r[1] != "sync", r[2]))


def step_share_rows(actor: Any, tokenizer: Any, suite: GridworldSuite, tasks: list, max_turns: int,
                    pool_size: int, repeats: int, sampling: Any) -> list[list[object]]:
    """Seconds per part of one RL step (HF engine, sync pool), medians over repeats, and their shares."""
    import torch
    from epo_overhead import arm_settings, step_targets, update

    from lightning_epo.rollout.batch import collate_episodes
    from lightning_epo.rollout.collector import EpisodeCollector
    from lightning_epo.rollout.hf_engine import HFEngine
    from lightning_epo.rollout.prompts import PromptBuilder

    pool = SyncEnvPool(suite, pool_size)
    parts: dict[str, list[float]] = {"environment": [], "generation": [], "rollout other": [], "update": []}
    opt = torch.optim.AdamW(actor.parameters(), lr=1e-6)
    try:
        prompts = PromptBuilder("gridworld", 2, think=False)
        collector = EpisodeCollector(pool, HFEngine(tokenizer, actor), tokenizer, prompts, max_turns)
        for _ in range(repeats):
            rollout, wall = collect(collector, tasks, sampling)
            batch = collate_episodes(rollout.episodes, tokenizer.pad_token_id)
            start = time.perf_counter()
            actor.train()
            targets, h_bar = step_targets(actor, batch, micro_batch=16)
            update(actor, opt, batch, targets, arm_settings(h_bar)["ppo_epo"], micro_batch=16)
            parts["update"].append(time.perf_counter() - start)
            parts["environment"].append(rollout.stats["env_s"])
            parts["generation"].append(rollout.stats["gen_s"])
            parts["rollout other"].append(wall - rollout.stats["env_s"] - rollout.stats["gen_s"])
    finally:
        pool.close()
    medians = {name: median(values) for name, values in parts.items()}
    total = sum(medians.values())
    return [[name, s, f"{100 * s / total:.1f}%"] for name, s in medians.items()] + [["RL step", total, "100%"]]


def main() -> None:
    import torch
    from omegaconf import OmegaConf

    from lightning_epo.models.loading import load_actor, load_tokenizer
    from lightning_epo.rollout.engine import SamplingParams
    from lightning_epo.rollout.expert_engine import ExpertEngine
    from lightning_epo.rollout.hf_engine import HFEngine

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer and shorter episodes (about a minute)")
    parser.add_argument("--model", help="a trained gridworld policy directory (default: the random tiny model)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    episodes, max_turns, repeats = (4, 4, 2) if args.quick else (16, 12, 3)
    sizes = [1, 4] if args.quick else [1, 4, 16]
    sampling = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=24)  # conf/rollout/hf.yaml
    model_cfg = OmegaConf.load(REPO_ROOT / "conf" / "model" / "tiny.yaml")
    if args.model:
        model_cfg.name_or_path, model_cfg.build_if_missing = args.model, False
    model_name = "trained policy" if args.model else "tiny model"
    tokenizer, actor = load_tokenizer(model_cfg), load_actor(model_cfg)
    suite = GridworldSuite()
    train = suite.tasks("train")
    engines = {  # the expert's turns are cheap: 8x the episodes, and enough turns to finish (<= 7)
        f"hf ({model_name})": (HFEngine(tokenizer, actor), train[:episodes], max_turns),
        "expert": (ExpertEngine(tokenizer), train[: 8 * episodes], 12),
    }
    print(machine_line())
    print(f"\nThroughput on gridworld: {repeats} repeats; hf: up to {max_turns} turns per episode, "
          f"{sampling.max_new_tokens} new tokens per turn at most")
    print_table(["engine", "pool", "size", "episodes", "env steps", "env steps/s", "gen tok/s", "turns/s", "collect s"],
                throughput_rows(engines, tokenizer, suite, sizes, repeats, sampling))
    print(f"\nOne RL step: {episodes} episodes of up to {max_turns} turns, HF engine ({model_name}), sync pool of "
          f"{max(sizes)}; update = old-policy pass + one PPO+EPO optimizer step of the actor (micro-batch 16)")
    print_table(["part", "seconds (median)", "share"],
                step_share_rows(actor, tokenizer, suite, train[:episodes], max_turns, max(sizes), repeats, sampling))


if __name__ == "__main__":
    main()
