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


def test_the_design_card_command_is_a_smoke_run_of_ppo_epo_on_sciworld_that_says_so(tmp_path, caplog):
    """``python train.py env=sciworld algo=ppo_epo`` (the design card's first command) runs the quickstart from the
    gridworld-trained policy: it says so at start and at the end, with ScienceWorld's own recipes, and trains PPO+EPO
    with its entropy panels. As shipped but its sizes (one step, two episodes per split, three turns)."""
    import logging

    cfg = user_config("env=sciworld", "algo=ppo_epo", "env.quickstart.total_steps=1", "env.quickstart.test_every=1",
                      "env.quickstart.val_size=2", "env.max_turns=3", "logger=none", f"run_dir={tmp_path}")
    assert (cfg.total_steps, cfg.env.val_size, cfg.data.episodes_per_step, cfg.algo.name) == (1, 2, 8, "ppo_epo")
    with caplog.at_level(logging.INFO):
        metrics = run(cfg)
    said = [r.getMessage() for r in caplog.records if "was trained on gridworld, not sciworld" in r.getMessage()]
    assert len(said) == 2 and "experiment=sciworld_1gpu" in said[0], said  # at start and as the run's last line
    assert caplog.records[-1].getMessage() == said[0]
    assert {"entropy/early_turns", "entropy/late_turns", "loss/entropy", "val/iid/success"} <= metrics.keys()


def test_a_policy_trained_on_the_runs_env_is_not_called_a_smoke_run(tmp_path):
    from lightning_epo.models.trained_on import other_environment_line, write_trained_on

    assert other_environment_line(REPO / "data" / "tiny_gridworld", "gridworld", "r") is None
    write_trained_on(tmp_path, "alfworld")
    assert other_environment_line(tmp_path, "gridworld", "R").endswith("gridworld's recipes: R")
    assert other_environment_line(tmp_path / "nothing recorded", "gridworld", "R") is None
