"""The paper's experiments (conf/experiment/paper_*.yaml): as shipped they pass the start checks on a machine with
the GPU pieces and hold the paper's settings; with only the model and the sizes shrunk each evaluates, trains and
evaluates its checkpoint on 2 CPU processes (DeepSpeed ZeRO-3 and vLLM as shipped)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, open_dict

from lightning_epo.runtime.config import check_machine, validate

PAPER = {
    # experiment: (env, algo, model, K, actor lr, alpha, group size, max turns)
    "paper_sciworld_ppo_epo": ("sciworld", "ppo_epo", "Qwen/Qwen2.5-7B-Instruct", 125, 3e-6, 0.05, 1, 30),
    "paper_sciworld_grpo_epo": ("sciworld", "grpo_epo", "Qwen/Qwen2.5-7B-Instruct", 125, 3e-6, 0.05, 8, 30),
    "paper_alfworld_ppo_epo": ("alfworld", "ppo_epo", "Qwen/Qwen2.5-3B-Instruct", 150, 5e-6, 0.1, 1, 50),
    "paper_alfworld_grpo_epo": ("alfworld", "grpo_epo", "Qwen/Qwen2.5-3B-Instruct", 150, 5e-6, 0.1, 8, 50),
}
# What a test may shrink (DESIGN: the model and the sizes); trainer, engine, evaluation and KL stay as shipped, with
# the GPUs replaced by 2 CPU processes (gloo) and bf16 by float32 (no bf16 DeepSpeed on CPU), and metrics in csv
SHRUNK_ON_CPU = [
    "trainer.accelerator=cpu", "trainer.devices=2", "trainer.precision=32-true", "model=tiny",
    "data.episodes_per_step=8", "env.max_turns=2", "env.val_size=2", "rollout.max_new_tokens=16", "total_steps=2",
    "logger=csv",
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
    assert cfg.algo.name == baseline and not cfg.algo.epo.smoothing and cfg.algo.entropy_coef == 0.0
    assert cfg.optim.actor_lr == PAPER[experiment][4] and cfg.algo.group_size == PAPER[experiment][6]
    validate(cfg)


def train_py(*arguments: str) -> subprocess.CompletedProcess:
    """``python train.py ARGUMENTS`` as a user runs it (Lightning starts the second rank as a second process)."""
    result = subprocess.run([sys.executable, "train.py", *arguments], cwd=REPO, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return result


@pytest.mark.vllm
@pytest.mark.parametrize(
    "experiment",
    [
        pytest.param("paper_alfworld_grpo_epo", marks=pytest.mark.alfworld),  # the one in make test (3 min)
        pytest.param("paper_sciworld_ppo_epo", marks=[pytest.mark.sciworld, pytest.mark.slow]),
        pytest.param("paper_sciworld_grpo_epo", marks=[pytest.mark.sciworld, pytest.mark.slow]),
        pytest.param("paper_alfworld_ppo_epo", marks=[pytest.mark.alfworld, pytest.mark.slow]),
    ],
)
def test_paper_experiment_as_shipped_evaluates_trains_and_evaluates_its_checkpoint(
    vllm_env, tiny_model_path, tmp_path, experiment
):
    """The paper's run on 2 CPU ranks with the tiny model and small sizes, everything else as shipped: DeepSpeed
    ZeRO-3, a vLLM engine per rank, the evaluation before the first RL step, the KL reference, the critic (PPO).
    Its first evaluation, two RL steps, then ``mode=eval`` of its checkpoint. (Shipped, the first evaluation died
    under ZeRO-3, and after it fit hung on the process group vLLM's shutdown had destroyed.)"""
    run_dir = tmp_path / "run"
    arguments = [f"experiment={experiment}", *SHRUNK_ON_CPU, f"model.name_or_path={tiny_model_path}",
                 f"hydra.run.dir={run_dir}"]
    cfg = shipped(*arguments[:-1])
    assert cfg.val_at_start and cfg.trainer.strategy.stage == 3 and cfg.rollout.engine._target_.endswith("VLLMEngine")
    train_py(*arguments)
    rows = list(csv.DictReader((run_dir / "csv" / "metrics.csv").open()))
    first_evaluation = [row for row in rows if row.get("val/iid/success") and row["step"] == "0"]
    updates = [row for row in rows if row.get("loss/total")]
    assert first_evaluation and len(updates) == 2
    assert all(bool(row.get("loss/value")) == ("ppo" in experiment) for row in updates)  # the critic's loss
    assert all(bool(row.get("loss/kl")) == (cfg.algo.kl_coef > 0) for row in updates)
    assert (run_dir / "checkpoints" / "last.ckpt").is_dir()  # DeepSpeed's sharded checkpoint

    train_py(*arguments, "mode=eval", "ckpt_path=last")
    results = json.loads((run_dir / "eval.json").read_text())
    assert {"val/iid/success", "val/ood/success"} <= results.keys()


ONE_GPU = {"alfworld_1gpu": "paper_alfworld_grpo_epo", "sciworld_1gpu": "paper_sciworld_grpo_epo"}


@pytest.mark.parametrize("experiment", sorted(ONE_GPU))
def test_one_gpu_recipe_fits_an_80_gb_gpu_and_passes_the_start_checks(gpu_machine, experiment):
    """The paper's run of its environment on one GPU: LoRA, gradient checkpointing, vLLM colocated with its share and
    sleep mode; the doctor's estimate of it fits 80 GB, the paper's own 8-GPU config on one GPU does not."""
    from lightning_epo.doctor.memory import GIB, KNOWN_SHAPES, estimate

    cfg, paper = shipped(f"experiment={experiment}"), shipped(f"experiment={ONE_GPU[experiment]}", "trainer.devices=1")
    assert (cfg.trainer.devices, cfg.trainer.precision, cfg.trainer.strategy) == (1, "bf16-mixed", "auto")
    assert cfg.model.lora.r and cfg.model.gradient_checkpointing and cfg.rollout.engine.enable_sleep_mode
    assert (cfg.algo.name, cfg.total_steps, cfg.algo.epo.alpha) == (paper.algo.name, paper.total_steps,
                                                                   paper.algo.epo.alpha)
    shape = KNOWN_SHAPES[cfg.model.name_or_path]
    assert estimate(shape, cfg, 1, 80 * GIB, on_gpu=True).fits
    assert not estimate(shape, paper, 1, 80 * GIB, on_gpu=True).fits
    validate(cfg)
    check_machine(cfg)


@pytest.mark.vllm
@pytest.mark.parametrize("experiment", [
    pytest.param("alfworld_1gpu", marks=[pytest.mark.alfworld, pytest.mark.slow]),  # 88 s: CI's 30 minutes
    pytest.param("sciworld_1gpu", marks=[pytest.mark.sciworld, pytest.mark.slow]),
])
def test_one_gpu_recipe_evaluates_and_trains_on_cpu(vllm_env, tiny_model_path, tmp_path, experiment):
    """As shipped but on one CPU process in float32 (no GPU here) with the tiny model and small sizes: the first
    evaluation and an RL step with LoRA, gradient checkpointing and vLLM."""
    run_dir = tmp_path / "run"
    on_cpu = [o.replace("total_steps=2", "total_steps=1") for o in SHRUNK_ON_CPU if o != "trainer.devices=2"]
    train_py(f"experiment={experiment}", *on_cpu, f"model.name_or_path={tiny_model_path}", f"hydra.run.dir={run_dir}")
    rows = list(csv.DictReader((run_dir / "csv" / "metrics.csv").open()))
    assert any(row.get("val/iid/success") and row["step"] == "0" for row in rows)
    assert len([row for row in rows if row.get("loss/total")]) == 1
