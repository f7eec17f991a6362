"""The paper's experiments (conf/experiment/paper_*.yaml): as shipped they pass the start checks on a machine with
the GPU pieces and hold the paper's settings; with tiny-model overrides each runs one RL step on this CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, open_dict

from lightning_epo.runtime import config
from lightning_epo.runtime.config import check_machine, validate
from lightning_epo.runtime.run import run

PAPER = {
    # experiment: (env, algo, model, K, actor lr, alpha, group size, max turns)
    "paper_sciworld_ppo_epo": ("sciworld", "ppo_epo", "Qwen/Qwen2.5-7B-Instruct", 125, 3e-6, 0.05, 1, 30),
    "paper_sciworld_grpo_epo": ("sciworld", "grpo_epo", "Qwen/Qwen2.5-7B-Instruct", 125, 3e-6, 0.05, 8, 30),
    "paper_alfworld_ppo_epo": ("alfworld", "ppo_epo", "Qwen/Qwen2.5-3B-Instruct", 150, 5e-6, 0.1, 1, 50),
    "paper_alfworld_grpo_epo": ("alfworld", "grpo_epo", "Qwen/Qwen2.5-3B-Instruct", 150, 5e-6, 0.1, 8, 50),
}
ONE_STEP_ON_CPU = [
    "model=tiny", "rollout=hf", "rollout.think=false", "rollout.max_new_tokens=8", "trainer=cpu", "trainer.devices=1",
    "logger=csv", "~callbacks.progress_bar", "total_steps=1", "test_every=1000", "val_at_start=false",
    "data.episodes_per_step=8", "env.max_turns=2", "env.pool_size=2", "env.val_size=2", "algo.kl_coef=0.0",
    "algo.mini_batches=1",
]


REPO = Path(__file__).resolve().parents[2]


def shipped(*overrides: str) -> DictConfig:
    """The config as a user composes it (the model not replaced by the test session's tiny model)."""
    with initialize_config_dir(str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    with open_dict(cfg):
        cfg.pop("hydra", None)
        cfg.run_dir = "unused"
    return cfg


@pytest.fixture
def gpu_machine(monkeypatch):
    """check_machine as on a CUDA node with vLLM and DeepSpeed installed."""
    monkeypatch.setattr(config.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(config.importlib.util, "find_spec", lambda name: object())


@pytest.mark.parametrize("experiment", sorted(PAPER))
def test_paper_experiment_holds_the_paper_settings_and_passes_the_start_checks(gpu_machine, experiment):
    cfg = shipped(f"experiment={experiment}")
    env, algo, model, total_steps, lr, alpha, group_size, max_turns = PAPER[experiment]
    assert (cfg.env.name, cfg.algo.name, cfg.model.name_or_path) == (env, algo, model)
    assert (cfg.total_steps, cfg.test_every, cfg.optim.actor_lr, cfg.algo.epo.alpha) == (total_steps, 5, lr, alpha)
    assert (cfg.algo.group_size, cfg.env.max_turns, cfg.algo.entropy_coef) == (group_size, max_turns, 0.001)
    assert (cfg.algo.epo.kappa_l, cfg.algo.epo.kappa_r, cfg.algo.epo.beta_start, cfg.algo.epo.beta_end) == (0, 2, 2, 1)
    assert (cfg.optim.warmup_ratio, cfg.optim.min_lr_ratio, cfg.rollout.max_new_tokens) == (0.1, 0.2, 512)
    assert cfg.rollout.think and cfg.model.max_prompt_tokens == 2048
    assert cfg.trainer.devices * cfg.data.episodes_per_step == 128
    assert (cfg.data.train_sampling.temperature, cfg.data.val_sampling.temperature) == (1.0, 0.4)
    assert cfg.rollout.engine._target_.endswith("VLLMEngine") and cfg.trainer.strategy.stage == 3
    validate(cfg)
    check_machine(cfg)


@pytest.mark.parametrize("experiment", sorted(PAPER))
def test_paper_baseline_is_the_same_run_without_epo(gpu_machine, experiment):
    baseline = "grpo" if "grpo" in experiment else "ppo"
    cfg = shipped(f"experiment={experiment}", f"algo={baseline}")
    assert cfg.algo.name == baseline and not cfg.algo.epo.enabled and cfg.algo.entropy_coef == 0.0
    assert cfg.optim.actor_lr == PAPER[experiment][4] and cfg.algo.group_size == PAPER[experiment][6]
    validate(cfg)


@pytest.mark.parametrize(
    "experiment",
    [
        pytest.param("paper_sciworld_ppo_epo", marks=pytest.mark.sciworld),
        pytest.param("paper_sciworld_grpo_epo", marks=pytest.mark.sciworld),
        pytest.param("paper_alfworld_ppo_epo", marks=pytest.mark.alfworld),
        pytest.param("paper_alfworld_grpo_epo", marks=pytest.mark.alfworld),
    ],
)
def test_paper_experiment_runs_one_rl_step_on_cpu_with_the_tiny_model(compose_cfg, tmp_path, experiment):
    cfg = compose_cfg(f"experiment={experiment}", *ONE_STEP_ON_CPU)
    metrics = run(cfg)
    assert metrics["train/turns"] > 0 and "loss/total" in metrics
    assert ("loss/value" in metrics) == ("ppo" in experiment)
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
