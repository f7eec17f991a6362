"""``experiment=gridworld_sft`` reaches the level docs/learning.md states for seeds 0-2 and 1 or 2 threads (slow: six
supervised runs of about 3 minutes and two evaluations each, about 30 minutes). Different thread counts round
differently: the cheapest stand-in for another machine, whose rounding once decided whether the warm start left
its plateau at all (0.78 IID on one machine, 0.22 on another).

    .venv/bin/python -m pytest -m slow tests/integration/test_warm_start_level.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# docs/learning.md: the final policy's level and how far each run may lie from it, per evaluation.
# 300 episodes over each split's 100 tasks (what the learning runs and the comparison report; 2026-11-23): out of
# distribution the seeds differ by up to +-0.06 there. 1,000 tasks per split, each once (2026-11-24): a run's figure
# no longer rests on 100 tasks, and every run lies within +-0.05.
EVALUATIONS = {
    "300 episodes": (("env.val_size=300",), {"val/iid/success": (0.71, 0.05), "val/ood/success": (0.27, 0.06)}),
    "1000 tasks": (("env.val_size=1000", "env.suite.num_eval_tasks=1000"),
                   {"val/iid/success": (0.76, 0.05), "val/ood/success": (0.33, 0.05)}),
}
pytestmark = pytest.mark.slow


def train_py(run_dir: Path, *args: str) -> None:
    subprocess.run([sys.executable, str(REPO / "train.py"), "experiment=gridworld_sft", *args, "logger=csv",
                    f"hydra.run.dir={run_dir}"], cwd=REPO, check=True, timeout=20 * 60)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_warm_start_reaches_the_stated_level(tmp_path, seed, threads):
    train_py(tmp_path, f"seed={seed}", f"torch_threads={threads}")
    for name, (overrides, level) in EVALUATIONS.items():
        train_py(tmp_path, f"seed={seed}", "torch_threads=1", "mode=eval", "ckpt_path=last", *overrides)
        final = json.loads((tmp_path / "eval.json").read_text())
        for metric, (stated, tolerance) in level.items():
            assert abs(final[metric] - stated) <= tolerance, (
                f"{name}: {metric} {final[metric]:.3f}, stated {stated} +- {tolerance}")
