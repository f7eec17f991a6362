"""Trainer configs: every one composes; DeepSpeed's config carries the clipping, precision and offload
flags; DeepSpeed on the CPU gets the CPU-capable strategy; a trainer this machine cannot run fails at start
with one line naming the fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch.strategies import DeepSpeedStrategy
from omegaconf import OmegaConf

from lightning_epo.core.errors import UserError
from lightning_epo.runtime import config
from lightning_epo.runtime.config import check_machine
from lightning_epo.training.strategies import CPUDeepSpeedStrategy, ZeroStrategy, deepspeed_config, deepspeed_strategy

REPO = Path(__file__).resolve().parents[2]
START_ON_CPU = """
import torch
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch.accelerators import CPUAccelerator
from lightning_epo.training.strategies import deepspeed_strategy
strategy = deepspeed_strategy(2, "32-true", 1.0, accelerator="cpu")
strategy.accelerator, strategy.parallel_devices = CPUAccelerator(), [torch.device("cpu")]
strategy.cluster_environment = LightningEnvironment()
strategy.setup_distributed()
import deepspeed.comm
print("started on", deepspeed.comm.get_world_size(), "process")
"""

TRAINERS = ["cpu", "gpu", "ddp", "deepspeed_stage_2", "deepspeed_stage_3"]


@pytest.mark.parametrize("name", TRAINERS)
def test_every_trainer_config_composes_and_resolves(compose_cfg, name):
    trainer = OmegaConf.to_container(compose_cfg(f"trainer={name}").trainer, resolve=True)
    assert trainer["_target_"] == "lightning.pytorch.Trainer"
    assert trainer["precision"] == ("32-true" if name == "cpu" else "bf16-mixed")
    if name.startswith("deepspeed"):
        strategy = {k: v for k, v in trainer["strategy"].items() if k not in ("_target_", "accelerator")}
        assert trainer["strategy"]["accelerator"] == trainer["accelerator"]
        config = deepspeed_config(**strategy)
        assert config["zero_optimization"]["stage"] == int(name[-1])
        assert config["gradient_clipping"] == 1.0  # optim.grad_clip, now applied by DeepSpeed


def test_deepspeed_config_sets_clipping_bf16_overflow_check_and_offload():
    config = deepspeed_config(3, "bf16-mixed", 0.5, offload_optimizer=True, offload_parameters=True, pin_memory=False)
    zero = config["zero_optimization"]
    assert config["gradient_clipping"] == 0.5
    assert config["bf16"] == {"enabled": True, "check_grad_overflow": True}
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": False}
    assert zero["offload_param"] == {"device": "cpu", "pin_memory": False}
    plain = deepspeed_config(2, "32-true", 1.0)
    assert "bf16" not in plain and "offload_optimizer" not in plain["zero_optimization"]
    # Lightning sets gradient_accumulation_steps itself and refuses a config that has it
    assert "gradient_accumulation_steps" not in config


def test_deepspeed_config_rejects_parameter_offload_below_stage_3():
    with pytest.raises(UserError, match="offload_parameters needs ZeRO stage 3"):
        deepspeed_config(2, "bf16-mixed", 1.0, offload_parameters=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_gpu_trainer_without_cuda_names_the_cpu_alternatives(compose_cfg):
    with pytest.raises(UserError, match="no CUDA GPU is visible: use trainer=cpu"):
        check_machine(compose_cfg("trainer=ddp"))
    check_machine(compose_cfg("trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"))


def test_deepspeed_requirements_are_checked_before_anything_is_built(compose_cfg, monkeypatch):
    monkeypatch.setattr(config, "_missing_for_deepspeed", lambda accelerator: ["CUDA GPUs", "the deepspeed package"])
    with pytest.raises(UserError, match=r"needs CUDA GPUs and the deepspeed package: .*requirements.txt.*"
                                        r"trainer.accelerator=cpu trainer.devices=2"):
        check_machine(compose_cfg("trainer=deepspeed_stage_2"))
    monkeypatch.setattr(config, "_missing_for_deepspeed", lambda accelerator: [])
    check_machine(compose_cfg("trainer=deepspeed_stage_2"))
    check_machine(compose_cfg("trainer=deepspeed_stage_3"))  # rollout=hf samples from a gathered copy
    with pytest.raises(UserError, match="optim.optimizer._target_=deepspeed.ops.adam.DeepSpeedCPUAdam"):
        check_machine(compose_cfg("trainer=deepspeed_stage_3", "trainer.strategy.offload_optimizer=true"))
    with pytest.raises(UserError, match="set algo.target_kl=null"):
        check_machine(compose_cfg("trainer=deepspeed_stage_2", "algo.target_kl=0.02"))


def test_deepspeed_on_cpu_needs_no_cuda_and_gets_the_cpu_strategy(compose_cfg):
    cpu = ["trainer.accelerator=cpu", "trainer.devices=2", "trainer.precision=32-true"]
    check_machine(compose_cfg("trainer=deepspeed_stage_3", *cpu))  # passes on a machine without CUDA too
    assert type(deepspeed_strategy(3, "32-true", 1.0, accelerator="cpu")) is CPUDeepSpeedStrategy
    gpu = deepspeed_strategy(2, "bf16-mixed", 1.0, accelerator="gpu")
    # GPU runs get Lightning's strategy with one engine at a time (an evaluation's before fit's)
    assert type(gpu) is ZeroStrategy and isinstance(gpu, DeepSpeedStrategy)
    assert gpu.config["zero_optimization"]["stage"] == 2


@pytest.mark.deepspeed
def test_deepspeed_starts_on_cpu_without_waiting_on_a_build_lock(tmp_path):
    """DeepSpeed's CPU backend JIT-builds a shared-memory op as it starts; a build killed midway leaves torch's lock
    file, on which every later start waited forever (the distributed tests hung in CI, 2026-11-27). A start with
    such a lock in its extensions directory must finish."""
    (tmp_path / "deepspeed_shm_comm").mkdir()
    (tmp_path / "deepspeed_shm_comm" / "lock").touch()  # left by a killed build
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path), "MASTER_PORT": "29517", "PYTHONPATH": str(REPO)}
    try:
        done = subprocess.run([sys.executable, "-c", START_ON_CPU], env=env, capture_output=True, text=True,
                              timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("DeepSpeed's start on CPU waited 120 s on the stale build lock")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "started on 1 process" in done.stdout
