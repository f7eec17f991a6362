"""``experiment=smollm2_sciworld`` as shipped, the tiny model in SmolLM2's place and the sizes shrunk: the warm start
on gold paths, then PPO+EPO with its 1-layer critic (the tiny model has 2 layers; SmolLM2's recipe keeps 3 of 30) and
LoRA adapters, one RL step and an evaluation with per-task success and ScienceWorld's score. Needs ScienceWorld and
Java (marked ``sciworld``, in the default suite here)."""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest
import torch

from lightning_epo.runtime.run import run
from lightning_epo.runtime.warm_start import stage_overrides

pytestmark = [
    pytest.mark.sciworld,
    pytest.mark.skipif(importlib.util.find_spec("scienceworld") is None
                       or (shutil.which("java") is None and not os.environ.get("JAVA_HOME")),
                       reason="needs ScienceWorld and Java"),
]
RECIPE = [
    "experiment=smollm2_sciworld", "logger=csv", "~callbacks.progress_bar", "total_steps=1", "test_every=1",
    "env.val_size=2", "env.max_turns=3", "env.pool_size=1", "data.episodes_per_step=2", "model.critic_layers=1",
    # the warm start's 4 mini-batches need 4 episodes a step
    "warm_start.overrides=['total_steps=1','test_every=1','env.val_size=2','data.episodes_per_step=4']",
]


def test_the_sciworld_recipe_warm_starts_then_trains_ppo_with_a_small_critic_and_evaluates(compose_cfg,
                                                                                          tiny_model_path, tmp_path):
    overrides = [*RECIPE, f"model.name_or_path={tiny_model_path}"]
    metrics = run(compose_cfg(*overrides), overrides=overrides)
    assert (tmp_path / "run" / "warm_start" / "policy" / "config.json").is_file()
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)  # as a resume loads it
    assert ckpt["rl_state"]["rl_step"] == 1
    state = ckpt["state_dict"]
    assert any(k.startswith("actor.") and "lora_" in k for k in state)  # RL trained adapters
    critic_layers = {k.split(".layers.")[1].split(".")[0] for k in state if k.startswith("critic.") and ".layers." in k}
    assert critic_layers == {"0"} and ckpt["state_settings"]["model.critic_layers"] == 1
    assert {"loss/value", "critic/explained_variance", "epo/beta", "val/iid/success", "val/ood/success",
            "val/iid/score", "val/ood/score"} <= metrics.keys()
    tasks = {k.split("/")[3] for k in metrics if k.startswith("val/iid/task/") and k.endswith("/success")}
    assert tasks and tasks <= set(compose_cfg("experiment=smollm2_sciworld").env.suite.task_subset)
    assert all(0 <= metrics[k] <= 100 for k in metrics if k.endswith("/score"))


def test_the_warm_start_plays_the_tasks_and_prompts_rl_plays(compose_cfg, tmp_path):
    cfg = compose_cfg("experiment=smollm2_sciworld")
    stage = compose_cfg(*stage_overrides(cfg, ["experiment=smollm2_sciworld"], tmp_path))
    assert stage.algo.name == "sft" and stage.env.suite.gold_path and not cfg.env.suite.gold_path
    for key in ("max_turns", "history_length", "prompt", "suite.task_subset"):
        assert _at(stage.env, key) == _at(cfg.env, key), key


def _at(node, dotted: str):
    for part in dotted.split("."):
        node = node[part]
    return node


def test_the_design_cards_smoke_run_names_the_cpu_recipe_and_its_model_step(compose_cfg, monkeypatch, tmp_path):
    """``python train.py env=sciworld algo=ppo_epo`` ends on ScienceWorld's recipes (runtime/run.py: its last line):
    the SmolLM2 recipe first, with ``make smollm2`` where the model is not built."""
    from lightning_epo.runtime import resolvers

    assert "experiment=smollm2_sciworld (SmolLM2-135M, PPO+EPO on a CPU)" in str(
        compose_cfg("env=sciworld", "algo=ppo_epo").env.recipes).replace(": run make smollm2 first", "")
    monkeypatch.setattr(resolvers, "Path", lambda *parts: tmp_path / "nothing")  # the model is not built
    recipes = compose_cfg("env=sciworld", "algo=ppo_epo").env.recipes
    assert recipes.startswith("python train.py experiment=smollm2_sciworld (SmolLM2-135M, PPO+EPO on a CPU: run make "
                              "smollm2 first), experiment=sciworld_1gpu")
