"""A checkpoint records the settings that fix its state's shapes and meaning; a resume with other settings is refused
at start, in one line naming each differing key and the fix, before any model is built."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lightning_epo.core.errors import ConfigError
from lightning_epo.runtime.run import run
from lightning_epo.runtime.state_settings import check_checkpoint_settings, state_settings
from lightning_epo.training import module
from tests.integration.train_command import refused_before_the_run_began

REPO = Path(__file__).resolve().parents[2]
FAST = ["debug=fast", "logger=csv", "~callbacks.progress_bar", "test_every=1000", "total_steps=2", "stop_at_step=1",
        "data.episodes_per_step=4", "env.max_turns=2", "rollout.max_new_tokens=8"]
FIX = "resume with the settings it was saved with, or start a new run from its weights"


def trained(compose_cfg, tmp_path: Path, name: str, *overrides: str) -> tuple[Path, dict]:
    """One RL step of a run with ``overrides`` (stopped before its total): its last.ckpt and its recorded settings."""
    cfg = compose_cfg(*FAST, *overrides, f"run_dir={tmp_path / name}")
    run(cfg)
    ckpt = tmp_path / name / "checkpoints" / "last.ckpt"
    return ckpt, torch.load(ckpt, weights_only=True)["state_settings"]


def forbid_building_models(monkeypatch) -> None:
    """From here on, building a model fails the test: a refusal must come first."""
    def built(*args, **kwargs):
        raise AssertionError("a model was built")
    monkeypatch.setattr(module, "load_models", built)


def refusal(compose_cfg, tmp_path: Path, ckpt: Path, *overrides: str) -> str:
    with pytest.raises(ConfigError) as error:
        run(compose_cfg(*FAST, *overrides, f"ckpt_path={ckpt}", f"run_dir={tmp_path / 'resumed'}"))
    assert "\n" not in str(error.value)
    return str(error.value)


def test_a_lora_checkpoint_resumed_without_lora_names_the_setting(compose_cfg, tmp_path, monkeypatch):
    ckpt, saved = trained(compose_cfg, tmp_path, "lora", "model.lora.r=8")
    assert saved == state_settings(compose_cfg(*FAST, "model.lora.r=8"))
    forbid_building_models(monkeypatch)
    message = refusal(compose_cfg, tmp_path, ckpt)
    assert message.startswith(f"ckpt_path '{ckpt}' was saved with other settings: model.lora.r: 8 (this run: null):")
    assert FIX in message and "warm_start" in message and "export_policy" in message


def test_a_full_ppo_checkpoint_resumed_with_lora_or_without_its_critic_names_the_settings(
    compose_cfg, tmp_path, monkeypatch
):
    ckpt, _ = trained(compose_cfg, tmp_path, "ppo", "algo=ppo")
    forbid_building_models(monkeypatch)
    lora = refusal(compose_cfg, tmp_path, ckpt, "algo=ppo", "model.lora.r=8")
    assert "model.lora.r: null (this run: 8)" in lora
    grpo = refusal(compose_cfg, tmp_path, ckpt, "algo=grpo_epo")
    assert grpo.startswith(f"ckpt_path '{ckpt}' was saved with other settings: algo.critic: true (this run: false)")

    start = time.monotonic()  # as a user sees it: one line, exit status 2
    done = subprocess.run([sys.executable, str(REPO / "train.py"), "~experiment", *FAST, "algo=grpo_epo",
                           f"model.name_or_path={compose_cfg().model.name_or_path}", f"ckpt_path={ckpt}",
                           f"hydra.run.dir={tmp_path / 'cli'}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert [line for line in done.stderr.splitlines() if line.strip()][-1] == f"error: {grpo}"
    assert refused_before_the_run_began(tmp_path / "cli") and time.monotonic() - start < 60


def test_a_checkpoint_that_records_no_settings_is_left_to_the_loader(compose_cfg, tmp_path):
    """Checkpoints written before the settings were recorded: nothing to compare, Lightning's load decides."""
    ckpt = tmp_path / "old.ckpt"
    torch.save({"pytorch-lightning_version": "2.6.0", "state_dict": {}}, ckpt)
    check_checkpoint_settings(str(ckpt), state_settings(compose_cfg()))


def saved_with(path: Path, settings: dict) -> Path:
    """A checkpoint file at ``path`` that records ``settings`` (its state is beside the point here)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"pytorch-lightning_version": "2.6.0", "state_settings": settings}, path)
    return path


def test_a_checkpoint_of_another_tiny_model_size_names_the_architecture(compose_cfg, tmp_path):
    ckpt = saved_with(tmp_path / "last.ckpt", state_settings(compose_cfg()))
    wider = compose_cfg(f"model.name_or_path={tmp_path / 'wider'}", "model.build_if_missing=true",
                        "model.tiny.hidden_size=128")
    with pytest.raises(ConfigError, match=r"other settings: model architecture hidden_size: 64 \(this run: 128\):"):
        check_checkpoint_settings(str(ckpt), state_settings(wider))


def test_a_deepspeed_checkpoint_resumed_without_deepspeed_names_the_stage(compose_cfg, tmp_path):
    """DeepSpeed's checkpoint is a directory: Lightning's entries are in its first rank's model states."""
    zero3 = ["trainer=deepspeed_stage_3", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.precision=32-true"]
    ckpt = tmp_path / "last.ckpt"
    saved_with(ckpt / "checkpoint" / "zero_pp_rank_0_mp_rank_00_model_states.pt", state_settings(compose_cfg(*zero3)))
    with pytest.raises(ConfigError, match=r"saved with other settings: trainer.strategy.stage: 3 \(this run: null\)"):
        check_checkpoint_settings(str(ckpt), state_settings(compose_cfg()))
    check_checkpoint_settings(str(ckpt), state_settings(compose_cfg(*zero3)))


def test_a_checkpoint_of_adapters_on_the_top_layers_resumed_with_adapters_everywhere_names_the_setting(
    compose_cfg, tmp_path
):
    top = state_settings(compose_cfg(*FAST, "model.lora.r=8", "model.lora.top_layers=1"))
    ckpt = tmp_path / "top.ckpt"
    torch.save({"state_settings": top}, ckpt)
    with pytest.raises(ConfigError, match=r"model.lora.top_layers: 1 \(this run: null\)"):
        check_checkpoint_settings(str(ckpt), state_settings(compose_cfg(*FAST, "model.lora.r=8")))
    check_checkpoint_settings(str(ckpt), top)
