"""``warm_start`` and ``export_policy``: RL starts from the supervised stage's exported policy, in one command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from lightning_epo.core.errors import ConfigError
from lightning_epo.runtime.run import run
from lightning_epo.runtime.warm_start import override_key, stage_overrides

FAST = ["debug=fast", "logger=csv", "~callbacks.progress_bar", "test_every=1000"]
QUICK_STAGE = "warm_start.overrides=['total_steps=2','test_every=1000','data.episodes_per_step=4','env.max_turns=3','logger=csv']"


def actor_in(ckpt_path: Path) -> dict[str, torch.Tensor]:
    state = torch.load(ckpt_path, map_location="cpu", weights_only=False)["state_dict"]
    return {k.removeprefix("actor."): v for k, v in state.items() if k.startswith("actor.")}


def exported(policy: Path) -> dict[str, torch.Tensor]:
    return load_file(str(policy / "model.safetensors"))


def assert_same_weights(actor: dict[str, torch.Tensor], policy: dict[str, torch.Tensor]) -> None:
    """Bit for bit: identity is the point (an export is a copy, and a step at lr 0 writes the weights unchanged)."""
    assert policy and policy.keys() <= actor.keys()
    for name, tensor in policy.items():
        torch.testing.assert_close(actor[name], tensor, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize(
    "override,key",
    [("env.max_turns=5", "env"), ("+trainer/strategy=x", "trainer"), ("~callbacks.progress_bar", "callbacks"), ("seed=3", "seed")],
)
def test_override_key_is_the_top_level_key(override, key):
    assert override_key(override) == key


def test_stage_inherits_only_the_listed_keys_and_resumes_its_own_checkpoint(tmp_path):
    cfg = OmegaConf.create({
        "warm_start": {"experiment": "gridworld_sft", "overrides": ["total_steps=7"], "inherit": ["seed", "env"]},
        "env": {"history_length": 0}, "rollout": {"think": False}, "model": {"max_prompt_tokens": 512},
    })
    user = ["experiment=gridworld_learn", "seed=3", "env.suite.size=7", "optim.actor_lr=0", "algo=grpo_epo"]
    fresh = stage_overrides(cfg, user, tmp_path)
    assert fresh == ["experiment=gridworld_sft", "seed=3", "env.suite.size=7", "env.history_length=0", "rollout.think=false",
                     "model.max_prompt_tokens=512", "total_steps=7", f"run_dir={tmp_path}", "export_policy=true"]
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").touch()
    assert stage_overrides(cfg, user, tmp_path)[-1] == "ckpt_path=last"


def test_export_policy_writes_the_final_actor_only_for_a_completed_run(compose_cfg, tmp_path):
    run(compose_cfg(*FAST, "total_steps=2", "stop_at_step=1", "export_policy=true"))
    assert not (tmp_path / "run" / "policy").exists()
    run(compose_cfg(*FAST, "total_steps=2", "ckpt_path=last", "export_policy=true"))
    policy = tmp_path / "run" / "policy"
    assert (policy / "config.json").is_file() and (policy / "tokenizer.json").is_file()
    assert_same_weights(actor_in(tmp_path / "run" / "checkpoints" / "last.ckpt"), exported(policy))


def test_rl_starts_from_the_warm_start_policy(compose_cfg, tmp_path, tiny_model_path):
    """With an RL learning rate of 0 (the control) the actor ends exactly at the warm start; with the default
    it moves away from it; and the warm start itself moved away from the tiny model."""
    args = [*FAST, "experiment=gridworld_learn", QUICK_STAGE, "total_steps=2", "env.val_size=2", "val_at_start=false",
            "algo.group_size=2"]
    run(compose_cfg(*args, "optim.actor_lr=0"), overrides=[f"model.name_or_path={tiny_model_path}"])
    policy = tmp_path / "run" / "warm_start" / "policy"
    warm = exported(policy)
    assert_same_weights(actor_in(tmp_path / "run" / "checkpoints" / "last.ckpt"), warm)
    initial = load_file(str(Path(tiny_model_path) / "model.safetensors"))
    assert not torch.equal(warm["model.embed_tokens.weight"], initial["model.embed_tokens.weight"])
    stage_ckpt = torch.load(tmp_path / "run" / "warm_start" / "checkpoints" / "last.ckpt", weights_only=False)
    assert stage_ckpt["rl_state"]["rl_step"] == 2 and stage_ckpt["hyper_parameters"]["algo"]["name"] == "sft"

    # the same run directory again: the exported policy is reused, not retrained; RL with lr > 0 moves the actor
    mtime = (policy / "model.safetensors").stat().st_mtime_ns
    run(compose_cfg(*args), overrides=[])
    assert (policy / "model.safetensors").stat().st_mtime_ns == mtime
    # where each ran: a line each start of the RL run, one for the stage that trained once (machine_record.py)
    starts = [json.loads(line) for line in (tmp_path / "run" / "machines.jsonl").read_text().splitlines()]
    stage = [json.loads(line) for line in (tmp_path / "run" / "warm_start" / "machines.jsonl").read_text().splitlines()]
    assert [(s["precision"], s["resumed"]) for s in starts] == [("32-true", False)] * 2
    assert len(stage) == 1 and stage[0]["precision"] == "32-true" and stage[0]["cpu"]
    moved = actor_in(tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert any(not torch.equal(moved[name], tensor) for name, tensor in warm.items())


def test_warm_start_needs_one_process(compose_cfg):
    cfg = compose_cfg(*FAST, "experiment=gridworld_learn", "trainer.devices=2")
    with pytest.raises(ConfigError, match="warm_start runs in one process"):
        run(cfg, overrides=[])


def test_evaluating_a_warm_started_experiment_needs_its_checkpoint(compose_cfg):
    with pytest.raises(ConfigError, match="mode=eval of a warm-started experiment needs the weights to evaluate"):
        run(compose_cfg(*FAST, "experiment=gridworld_learn", "mode=eval"), overrides=[])


def test_unknown_warm_start_experiment_is_one_line(compose_cfg):
    with pytest.raises(ConfigError, match="warm_start.experiment='nope' is not valid; choose one of: .*gridworld_sft"):
        run(compose_cfg(*FAST, "experiment=gridworld_learn", "warm_start.experiment=nope"), overrides=[])


@pytest.mark.parametrize("experiment", ["gridworld_learn", "smollm2_gridworld", "smollm2_alfworld",
                                        "smollm2_sciworld"])
def test_the_stage_logs_where_the_run_logs(compose_cfg, experiment, tmp_path):
    """``logger=csv`` on the command line reaches the warm start too: its stage used to log to wandb (offline without
    a key) while the run the user started wrote csv."""
    cfg = compose_cfg(f"experiment={experiment}")
    assert "logger=csv" in stage_overrides(cfg, [f"experiment={experiment}", "logger=csv"], tmp_path)


def test_float32_on_the_command_line_holds_for_the_smollm2_recipes_warm_start_too(compose_cfg, tmp_path, monkeypatch):
    """The recipe picks bf16 where the CPU computes it natively (docs/bf16_eager_cpu.md); a user who asks for float32
    there gets it in the supervised stage as well as in RL."""
    from lightning_epo.runtime import config

    monkeypatch.setattr(config, "cpu_computes_bf16", lambda: True)
    user = ["experiment=smollm2_gridworld", "trainer.precision=32-true"]  # attention and vLLM's dtype follow it
    stage = compose_cfg(*stage_overrides(compose_cfg(*user), user, tmp_path))
    assert (stage.trainer.precision, stage.model.attn_implementation) == ("32-true", "sdpa")
    stage = compose_cfg(*stage_overrides(compose_cfg(user[0]), user[:1], tmp_path))
    assert (stage.trainer.precision, stage.model.attn_implementation) == ("bf16-mixed", "eager")


@pytest.mark.parametrize("experiment", ["gridworld_learn", "smollm2_gridworld", "smollm2_alfworld",
                                        "smollm2_sciworld"])
def test_the_stage_trains_on_the_prompts_the_run_plays(compose_cfg, experiment, tmp_path):
    """The warm start's prompts are the RL stage's (environment, history window, think instruction): an experiment
    that shortens its prompts must shorten its stage's too, or RL starts from a policy trained on other prompts."""
    cfg = compose_cfg(f"experiment={experiment}")
    stage = compose_cfg(*stage_overrides(cfg, [f"experiment={experiment}"], tmp_path))
    prompt = OmegaConf.to_container(cfg.data.collector.prompt, resolve=True)
    assert OmegaConf.to_container(stage.data.collector.prompt, resolve=True) == prompt
    assert stage.model.max_prompt_tokens == cfg.model.max_prompt_tokens
