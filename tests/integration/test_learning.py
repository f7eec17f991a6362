"""``experiment=gridworld_learn`` learns on a CPU: the bar, as a user runs it (slow: about 9 + 6 + 3 minutes alone).

    .venv/bin/python -m pytest -m slow tests/integration/test_learning.py
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lightning_epo.reports.run_history import load_history

REPO = Path(__file__).resolve().parents[2]
BUDGET_S = 15 * 60
FINAL_EPISODES = 300  # per split for the final comparison: 3 episodes of each task (a 100-task evaluation is +-0.04)
IID_MARGIN, OOD_MARGIN = 0.08, 0.05  # RL's final success above the control's (= the warm start's weights)
pytestmark = pytest.mark.slow


def train(run_dir: Path, *args: str) -> tuple[dict, float]:
    start = time.monotonic()
    subprocess.run([sys.executable, str(REPO / "train.py"), "experiment=gridworld_learn", *args,
                    f"hydra.run.dir={run_dir}"], cwd=REPO, check=True, timeout=2 * BUDGET_S)
    return load_history(run_dir), time.monotonic() - start


def final_eval(run_dir: Path) -> dict:
    """The run's last checkpoint evaluated on ``FINAL_EPISODES`` episodes per split (``mode=eval``)."""
    train(run_dir, "mode=eval", "ckpt_path=last", f"env.val_size={FINAL_EPISODES}")
    return json.loads((run_dir / "eval.json").read_text())


def first_and_last(history: dict, metric: str) -> tuple[float, float]:
    points = history[metric]
    assert points[0][0] == 0, f"{metric}: no evaluation before the first RL step"
    return points[0][1], points[-1][1]


def test_rl_lifts_the_warm_start_to_80_percent_within_15_minutes_and_beats_its_control(tmp_path):
    """The bar, and that the rise comes from RL: the lr=0 control (same warm start, reused) stays
    near its start; on 300 episodes per split the learning run's final policy beats the control by
    ``IID_MARGIN`` on IID tasks and ``OOD_MARGIN`` on OOD tasks."""
    history, wall_s = train(tmp_path / "learn")
    iid_start, iid_end = first_and_last(history, "val/iid/success")
    ood_start, ood_end = first_and_last(history, "val/ood/success")
    assert wall_s < BUDGET_S, f"took {wall_s:.0f} s"
    assert iid_end >= 0.8 and iid_end > iid_start, (iid_start, iid_end)
    assert ood_end > ood_start, (ood_start, ood_end)

    shutil.copytree(tmp_path / "learn" / "warm_start", tmp_path / "control" / "warm_start")
    control, _ = train(tmp_path / "control", "optim.actor_lr=0")
    control_start, control_end = first_and_last(control, "val/iid/success")
    assert control_start == iid_start, "the control must start from the same warm start"
    assert abs(control_end - control_start) <= 0.1, (control_start, control_end)

    learned, held = final_eval(tmp_path / "learn"), final_eval(tmp_path / "control")
    assert learned["val/iid/success"] - held["val/iid/success"] >= IID_MARGIN, (learned, held)
    assert learned["val/ood/success"] - held["val/ood/success"] >= OOD_MARGIN, (learned, held)
