"""PPO+EPO on ``experiment=gridworld_long`` from the shipped warm start clears the comparison's bar, as
docs/comparison.md runs it: scripts/gridworld_comparison.sh, its final evaluations included (slow: three runs of
about 20 minutes, two at a time, and their evaluations; 43 minutes on 2 cores).

    .venv/bin/python -m pytest -m slow tests/integration/test_comparison_bar.py
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_epo.reports.run_history import load_history

REPO = Path(__file__).resolve().parents[2]
SEEDS = (0, 1, 2)
RL_STEPS = 30
BAR = 0.59  # mean final IID success over the seeds, 300 episodes per split
pytestmark = pytest.mark.slow


def test_ppo_epo_clears_the_bar_over_three_seeds_within_30_rl_steps(tmp_path):
    """Mean final IID success of seeds 0-2 on 300 episodes per split is at least ``BAR`` after ``RL_STEPS``
    RL steps, and every seed ends above its own step-0 evaluation (the shipped warm start)."""
    shutil.copytree(REPO / "data" / "tiny_gridworld", tmp_path / "warm_start" / "policy")
    env = {**os.environ, "SEEDS": " ".join(map(str, SEEDS)), "JOBS": "2", "ALGOS": "ppo_epo", "PY": sys.executable,
           "FINAL_EPISODES": "300"}
    subprocess.run(["bash", str(REPO / "scripts" / "gridworld_comparison.sh"), str(tmp_path)], cwd=REPO, env=env,
                   check=True, timeout=3 * 60 * 60)

    finals = []
    for seed in SEEDS:
        run_dir = tmp_path / "ppo_epo" / f"s{seed}"
        iid = load_history(run_dir)["val/iid/success"]
        assert iid[0][0] == 0 and iid[-1][0] == RL_STEPS - 1, f"seed {seed}: evaluated at steps {[s for s, _ in iid]}"
        assert iid[-1][1] > iid[0][1], f"seed {seed}: IID {iid[0][1]:.2f} at step 0, {iid[-1][1]:.2f} at the end"
        finals.append(json.loads((run_dir / "eval.json").read_text())["val/iid/success"])
    assert statistics.mean(finals) >= BAR, f"final IID per seed {finals}, mean {statistics.mean(finals):.3f}"
