"""``experiment=gridworld_sft`` reaches the level docs/learning.md states for seeds 0-2 and 1 or 2 threads (slow: six
supervised runs of about 4 minutes and their evaluations, about 30 minutes). Different thread counts round
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
# docs/learning.md: the final policy on 300 episodes per split (2026-11-23). Out of distribution
# the seeds themselves differ by up to +-0.06 (seed 0 about 0.32, seeds 1 and 2 about 0.22; thread counts agree).
LEVEL = {"val/iid/success": (0.71, 0.05), "val/ood/success": (0.27, 0.06)}
pytestmark = pytest.mark.slow


def train_py(run_dir: Path, *args: str) -> None:
    subprocess.run([sys.executable, str(REPO / "train.py"), "experiment=gridworld_sft", *args, "logger=csv",
                    f"hydra.run.dir={run_dir}"], cwd=REPO, check=True, timeout=20 * 60)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_warm_start_reaches_the_stated_level(tmp_path, seed, threads):
    train_py(tmp_path, f"seed={seed}", f"torch_threads={threads}")
    train_py(tmp_path, f"seed={seed}", "mode=eval", "ckpt_path=last", "env.val_size=300")
    final = json.loads((tmp_path / "eval.json").read_text())
    for metric, (level, tolerance) in LEVEL.items():
        assert abs(final[metric] - level) <= tolerance, f"{metric} {final[metric]:.3f}, stated {level} +- {tolerance}"
