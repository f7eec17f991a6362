"""What ``python train.py`` runs: experiment=quickstart, RL from the shipped warm-started tiny policy."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import open_dict

from lightning_epo.runtime.run import run

REPO = Path(__file__).resolve().parents[2]


def user_config(*overrides: str):
    """The config as ``python train.py`` composes it (no test model put in)."""
    with initialize_config_dir(str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    with open_dict(cfg):
        cfg.pop("hydra", None)
    return cfg


def test_no_arguments_means_rl_from_the_shipped_policy_with_a_start_and_end_evaluation():
    cfg = user_config()
    assert cfg.model.name_or_path == "data/tiny_gridworld" and not cfg.model.build_if_missing
    assert cfg.warm_start is None and cfg.val_at_start and cfg.env.name == "gridworld"
    bare = user_config("~experiment")
    assert bare.model.name_or_path == "data/tiny_model" and bare.data.oversample == 1 and not bare.val_at_start


def test_the_shipped_policy_plays_gridworld(tmp_path):
    """A random tiny model never makes a valid move; the shipped one wins most IID tasks at temperature 0.4."""
    cfg = user_config("mode=eval", "env.val_size=24", "logger=none", f"run_dir={tmp_path}", "torch_threads=1")
    metrics = run(cfg)
    assert metrics["val/iid/success"] >= 0.5, metrics
