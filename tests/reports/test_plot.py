"""The figure command on hand-made runs (two algorithms, two seeds each): one non-blank PNG per panel."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
from matplotlib import colors, image

from lightning_epo.reports.plot import main, plot_runs

STEPS = 20
PANELS = ["train_reward", "val_iid_success", "val_ood_success", "entropy_turns", "entropy_tokens", "entropy_by_turn"]
TRAIN = ["train/reward", "entropy/early_turns", "entropy/late_turns", "entropy/early_tokens", "entropy/late_tokens"]


def make_run(root: Path, algo: str, seed: int, level: float, splits=("iid", "ood")) -> Path:
    """A CSV run whose curves sit at ``level`` (+ a seed-dependent wiggle, so the seed band is visible)."""
    run_dir = root / f"{algo}_s{seed}"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text(f"seed: {seed}\nenv: {{name: gridworld}}\nalgo: {{name: {algo}}}\n")
    (run_dir / "csv").mkdir()
    val = [f"val/{s}/success" for s in splits]
    with open(run_dir / "csv" / "metrics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, ["epoch", "step", *TRAIN, *val])
        writer.writeheader()
        for k in range(STEPS):
            wiggle = 0.1 * (seed + 1) * math.sin(k)
            writer.writerow({"epoch": 0, "step": k, **{m: level + 0.05 * k + wiggle + i for i, m in enumerate(TRAIN)}})
            if k % 5 == 4:
                success = min(1.0, max(0.0, level * k / STEPS + wiggle))
                writer.writerow({"epoch": 0, "step": k, **{m: success for m in val}})
    with open(run_dir / "turn_entropy.jsonl", "w") as f:
        for k in range(STEPS):
            f.write(json.dumps({"step": k, "entropy": [level + 0.1 * t - 0.01 * k for t in range(6)] + [None]}) + "\n")
    return run_dir


@pytest.fixture
def runs(tmp_path):
    levels = {"ppo": 0.3, "ppo_epo": 0.8}
    return [make_run(tmp_path / "runs", algo, seed, level) for algo, level in levels.items() for seed in (0, 1)]


def pixels_near(png: Path, color: str) -> int:
    """How many pixels are within a small distance of ``color`` (anti-aliasing blurs the rest)."""
    rgb = image.imread(png)[..., :3]
    return int((np.abs(rgb - np.array(colors.to_rgb(color))).max(-1) < 0.08).sum())


def test_one_png_per_panel_with_a_line_for_each_algorithm(runs, tmp_path):
    written = plot_runs(runs, tmp_path / "figs")
    assert sorted(p.stem for p in written) == sorted(PANELS)
    for png in written:
        assert pixels_near(png, "C0") > 100 and pixels_near(png, "C1") > 100, png  # ppo blue, ppo_epo orange
        assert image.imread(png)[..., :3].std() > 0.05, png  # not a blank canvas


def test_panel_without_data_is_skipped(tmp_path, capsys):
    run = make_run(tmp_path, "grpo", 0, 0.5, splits=("iid",))
    (run / "turn_entropy.jsonl").unlink()
    main([str(run), "--out", str(tmp_path / "figs")])
    written = sorted(p.stem for p in (tmp_path / "figs").glob("*.png"))
    assert written == sorted(set(PANELS) - {"val_ood_success", "entropy_by_turn"})
    assert "wrote" in capsys.readouterr().out
