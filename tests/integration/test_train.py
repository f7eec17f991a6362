"""The whole loop through the real configs: every algo trains, resume restores the EPO state."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from lightning_epo.runtime.run import run
from lightning_epo.training.host_memory import release_free_memory

FAST = ["debug=fast", "logger=csv", "~callbacks.progress_bar"]
ALGOS = ["ppo", "grpo", "ppo_epo", "grpo_epo", "gigpo", "gigpo_epo", "ppo_epo_base", "ppo_epo_const_beta", "ppo_epo_decay", "ppo_ea", "sft"]


def load_ckpt(path):
    return torch.load(path, map_location="cpu", weights_only=False)


def callback_state(ckpt, name):
    (state,) = [v for k, v in ckpt["callbacks"].items() if k.startswith(name)]
    return state


@pytest.mark.parametrize("algo", ALGOS)
def test_every_algo_runs_two_rl_steps(compose_cfg, tmp_path, algo):
    cfg = compose_cfg(*FAST, f"algo={algo}", "test_every=1000")
    metrics = run(cfg)
    ckpt = load_ckpt(tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert ckpt["rl_state"]["rl_step"] == 2
    assert torch.isfinite(torch.tensor(metrics["loss/total"]))
    assert ("loss/value" in metrics) == cfg.algo.critic
    assert ("epo/beta" in metrics) == cfg.algo.epo.smoothing
    assert ("epo/entropy_coef" in metrics) == (cfg.algo.entropy_coef > 0)
    assert metrics["train/sampler_logprob_gap"] < 1e-4  # the hf engine samples from the updated actor, in float32
    # every output of the run sits under the run directory
    assert (tmp_path / "run" / "csv" / "metrics.csv").is_file()


def test_resume_restores_entropy_window_rl_step_and_sampler(compose_cfg, tmp_path):
    """(β_k follows the restored rl_step: test_exact_resume.py compares the logged epo/beta.)"""
    cfg = compose_cfg(*FAST, "total_steps=4", "stop_at_step=2", "test_every=1000")
    run(cfg)
    stopped = load_ckpt(tmp_path / "run" / "checkpoints" / "last.ckpt")
    window = callback_state(stopped, "EntropyWindow")["values"]
    assert len(window) == 2 and stopped["rl_state"]["rl_step"] == 2
    assert stopped["RolloutDataModule"]["sampler_step"] == 2  # the task sampler is checkpointed too

    run(compose_cfg(*FAST, "total_steps=4", "ckpt_path=last", "test_every=1000"))
    resumed = load_ckpt(tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert resumed["rl_state"]["rl_step"] == 4
    resumed_window = callback_state(resumed, "EntropyWindow")["values"]
    assert resumed_window[:2] == window and len(resumed_window) == 4  # restored from the checkpoint, not recomputed
    assert resumed["RolloutDataModule"]["sampler_step"] == 4


def test_eval_mode_samples_from_the_checkpointed_actor(compose_cfg, tmp_path):
    """``mode=eval`` with the model's own engine: Lightning fetches the first validation batch before any
    callback hook, so the DataModule must bind the engine to the restored actor itself."""
    run(compose_cfg(*FAST, "test_every=1000"))
    history = (tmp_path / "run" / "csv" / "metrics.csv").read_text()
    metrics = run(compose_cfg(*FAST, "mode=eval", "ckpt_path=last"))
    written = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert written == metrics and {"val/iid/success", "val/ood/success", "val/iid/turns"} <= written.keys()
    assert (tmp_path / "run" / "csv" / "metrics.csv").read_text() == history  # the run's history is left as it was
    rows = [json.loads(line) for line in (tmp_path / "run" / "eval_episodes.jsonl").read_text().splitlines()]
    for split in ("iid", "ood"):  # each episode of the evaluation, marked mode=eval (the training's are mode=train)
        won = [row["won"] for row in rows if row["mode"] == "eval" and row["split"] == split]
        assert len(won) == written[f"val/{split}/episodes"]
        assert sum(won) / len(won) == pytest.approx(written[f"val/{split}/success"])


def test_val_at_start_logs_the_starting_level_at_step_0(compose_cfg, tmp_path):
    run(compose_cfg(*FAST, "val_at_start=true", "test_every=2"))
    with open(tmp_path / "run" / "csv" / "metrics.csv") as f:
        val_steps = [int(row["step"]) for row in csv.DictReader(f) if row.get("val/iid/success")]
    assert val_steps == [0, 1]  # before the first update, then after RL step 2 (Lightning's step index 1)


def test_tiny_model_is_built_before_any_trainer_starts(compose_cfg, tmp_path, monkeypatch):
    """Built inside the module's configure_model, a ZeRO-3 rank builds it under zero.Init, several ranks at once
    (a fresh trainer=deepspeed_stage_3 run left data/tiny_model with tokenizer files only)."""
    from lightning_epo.runtime import run as run_module

    def no_trainer(*args, **kwargs):
        raise RuntimeError("no objects in this test")

    monkeypatch.setattr(run_module.hydra.utils, "instantiate", no_trainer)
    cfg = compose_cfg(*FAST, f"model.name_or_path={tmp_path / 'fresh_tiny'}", "model.build_if_missing=true")
    with pytest.raises(RuntimeError, match="no objects"):
        run(cfg)
    assert (tmp_path / "fresh_tiny" / "model.safetensors").is_file()


def test_an_evaluation_before_fit_hands_its_engine_and_environments_to_fit(compose_cfg, monkeypatch):
    """``val_at_start=true``: fit trains with the engine and the environment pool the first evaluation opened, and
    closes them once at the end. (Closed after the evaluation, a vLLM engine's shutdown destroyed the trainer's
    process group, and a distributed fit hung on it; a second start of the engine and the pool costs minutes.)"""
    from lightning_epo.envs.sync_pool import SyncEnvPool
    from lightning_epo.rollout.hf_engine import HFEngine

    events = []

    def recorded(method, event):
        return lambda self, *args, **kwargs: events.append(event) or method(self, *args, **kwargs)

    for cls, name in ((HFEngine, "engine"), (SyncEnvPool, "pool")):
        monkeypatch.setattr(cls, "__init__", recorded(cls.__init__, f"{name} built"))
        monkeypatch.setattr(cls, "close", recorded(cls.close, f"{name} closed"))
    metrics = run(compose_cfg(*FAST, "val_at_start=true", "test_every=1000"))
    assert sorted(events) == ["engine built", "engine closed", "pool built", "pool closed"]
    assert "val/iid/success" in metrics and "loss/total" in metrics


def test_the_parts_of_an_rl_step_add_up_to_the_step_and_are_said_in_its_line(compose_cfg, tmp_path, caplog):
    """perf/step_s is timed whole; the rollout, the old-policy passes (log-probs, values, reference), the update, the
    weight push and the checkpoint are timed on their own and add up to it (the rest is Lightning's own loop). Two
    mini-batches, so that the old-policy pass has log-probs to compute (those of the second's rows)."""
    caplog.set_level("INFO", logger="lightning_epo.training.module")
    run(compose_cfg(*FAST, "algo=ppo_epo", "algo.kl_coef=0.01", "algo.mini_batches=2", "test_every=1",
                    "callbacks.checkpoint.every_n_rl_steps=1"))
    rows = list(csv.DictReader((tmp_path / "run" / "csv" / "metrics.csv").open()))
    steps = [{k: float(v) for k, v in row.items() if v} for row in rows if row.get("perf/step_s")]
    assert len(steps) == 2
    parts = ["rollout", "old_logprob", "values", "ref_logprob", "update", "weight_sync", "checkpoint"]
    untimed = []
    for step in steps:
        timed = sum(step[f"perf/{part}_s"] for part in parts)
        assert timed <= step["perf/step_s"], step
        untimed.append((step["perf/step_s"] - timed) / max(0.5, 0.1 * timed))
        assert step["perf/gen_s"] + step["perf/env_s"] <= step["perf/rollout_s"]
        assert step["perf/update_flops_per_s"] > 0 and 0 < step["perf/update_peak_share"] < 1
        assert 0.1 < step["perf/host_peak_rss_gib"] < 64  # the trainer process's resident high-water mark, in GiB
        if release_free_memory() is not None:  # the update's freed heap, handed back (glibc on Linux)
            assert 0 <= step["perf/host_released_gib"] < step["perf/host_peak_rss_gib"]
    # Lightning's own loop is the rest: a stage left untimed shows in both steps, a pause of a loaded machine in one
    assert min(untimed) <= 1, steps
    assert sum(bool(row.get("perf/eval_s")) for row in rows) == 2  # an evaluation after each step
    lines = [r.getMessage() for r in caplog.records if " took " in r.getMessage()]
    assert [line.split(" took ")[0] for line in lines] == ["step 0", "step 1"]
    assert all("reference" in line and "checkpoint" in line and "matmul peak" in line for line in lines)
