"""ScienceWorld's own score along each task's gold path: how often it rises before the win, i.e. how much signal a
reward on the score's progress (``env.suite.score_reward``) gives beside the win.

    python benchmarks/sciworld_gold_scores.py [--tasks NAME ...] [--variations 3]

For each task (default: the SmolLM2 recipe's 8 short tasks, ``env.suite.task_subset`` of
``conf/experiment/smollm2_sciworld.yaml``) and its first ``--variations`` train variations (easy simplification, gold paths
on): the score after ``reset`` and after each gold step, and the number of rises before the win.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from omegaconf import OmegaConf

from lightning_epo.envs.sciworld import SciWorldSuite
from lightning_epo.envs.testing import follow_expert

RECIPE = Path(__file__).resolve().parents[1] / "conf" / "experiment" / "smollm2_sciworld.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=list(OmegaConf.load(RECIPE).env.suite.task_subset))
    parser.add_argument("--variations", type=int, default=3)
    args = parser.parse_args()
    suite = SciWorldSuite(gold_path=True, task_subset=args.tasks)
    env = suite.make_env()
    played: dict[str, int] = {}
    try:
        for task in suite.tasks("train"):
            if played.setdefault(task.name, 0) >= args.variations:
                continue
            played[task.name] += 1
            _, info = env.reset(task)
            scores = [info["score"]] + [step["score"] for _, _, step in follow_expert(env, info, 250)]
            below = [s for s in scores if s < 100]
            rises = sum(after > before for before, after in zip(below, below[1:]))
            print(f"{task.name} v{task.variation}: {'won' if scores[-1] == 100 else 'not won'}, "
                  f"{rises} rises before the win; scores {scores}", flush=True)
    finally:
        env.close()


if __name__ == "__main__":
    main()
