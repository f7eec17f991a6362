"""wandb reporting: two RL steps with logger=wandb (offline), read back from the run directory's files."""

from __future__ import annotations

import json
import math
import time

import pytest
from omegaconf import OmegaConf

from lightning_epo.callbacks.wandb_setup import WandbSetup, finish_wandb_run, run_tags
from lightning_epo.core.secrets import REDACTED
from lightning_epo.reports.run_history import load_history, load_run_config, wandb_records, wandb_run_files
from lightning_epo.runtime.resolvers import register_resolvers, run_id

SECRET = "sk-test-0123456789abcdef"

# DESIGN.md "Metric names" for ppo_epo (critic, no reference model): logged at every RL step ...
EVERY_STEP = [
    "train/reward", "train/success", "train/turns", "train/invalid_action_rate",
    "loss/policy", "loss/entropy", "loss/value", "loss/total", "epo/beta",
    "entropy/early_turns", "entropy/late_turns", "entropy/early_tokens", "entropy/late_tokens",
    "ppo/clipfrac", "ppo/approx_kl", "critic/value_mean", "critic/return_mean",
    "perf/rollout_s", "perf/update_s", "perf/gen_tokens_per_s", "perf/env_steps_per_s",
    "perf/gen_s", "perf/env_s", "perf/values_s", "perf/weight_sync_s", "perf/step_s",
    "perf/update_flops_per_s", "perf/update_peak_share", "perf/host_peak_rss_gib",
    "perf/host_released_gib",  # glibc on Linux (training/host_memory.py), as on every machine that runs make test
]
# ... only once the entropy window has an entry (k >= 1) ...
FROM_STEP_ONE = ["epo/entropy_ref", "loss/smooth"]
# ... after each evaluation (test_every=1) ...
VALIDATION = ["val/iid/success", "val/ood/success", "val/iid/reward", "val/ood/reward", "perf/eval_s"]
# ... and never: without a reference model no KL; with one mini-batch the update's own forward gives the old
# policy's log-probs (training/micro_batches.py's update_fills), so the actor has no old-policy pass to time.
ABSENT = ["loss/kl", "perf/old_logprob_s", "perf/ref_logprob_s"]


@pytest.fixture
def wandb_env(monkeypatch, tmp_path):
    """Offline wandb with a (fake) API key in the environment; WandbLogger's WANDB_MODE change is undone."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    yield
    finish_wandb_run()


def wait_for_exit_record(run_dir, timeout_s: float = 30.0) -> None:
    """``run.finish()`` can return before wandb's service has written the file out (seen under a loaded CPU):
    wait until the run's last record, ``exit``, is on disk."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        files = wandb_run_files(run_dir)
        if files and any(r.WhichOneof("record_type") == "exit" for r in wandb_records(files[-1])):
            return
        time.sleep(0.1)
    raise AssertionError(f"no wandb exit record under {run_dir} within {timeout_s} s")


def test_two_rl_steps_log_every_metric_to_wandb_files(compose_cfg, tmp_path, wandb_env):
    from lightning_epo.runtime.run import run

    register_resolvers()
    run_dir = tmp_path / "run"
    cfg = compose_cfg(
        "debug=fast", "logger=wandb", "~callbacks.progress_bar", "total_steps=2", "test_every=1",
        "++logger.id='${run_id:${run_dir}}'",
        "++callbacks.wandb_setup={_target_: lightning_epo.callbacks.wandb_setup.WandbSetup, _recursive_: false, "
        "config: '${run_config:}'}",
        "++callbacks.turn_entropy={_target_: lightning_epo.callbacks.turn_entropy.TurnEntropyLog, run_dir: '${run_dir}'}",
        "++callbacks.rollout_samples={_target_: lightning_epo.callbacks.rollout_samples.RolloutSamples, run_dir: '${run_dir}', "
        "num_episodes: 2}",
        "+hub_token=${oc.env:WANDB_API_KEY}",  # a secret-named key: must not reach the wandb config
        "+notes=uses ${oc.env:WANDB_API_KEY}",  # a secret value under an ordinary key: redacted
    )
    run(cfg)
    finish_wandb_run()
    wait_for_exit_record(run_dir)

    (run_file,) = wandb_run_files(run_dir)
    assert run_file.parent.name.endswith(run_id(str(run_dir)))  # the id is the run directory's
    history = load_history(run_dir)  # from the .wandb file, not from memory
    for name in EVERY_STEP:
        assert [k for k, _ in history.get(name, [])] == [0, 1], name
    for name in FROM_STEP_ONE:
        assert [k for k, _ in history.get(name, [])] == [1], name
    assert 1 in dict(history["epo/out_of_range_frac"])
    for name in VALIDATION:
        assert history.get(name), name
    for name in ABSENT:
        assert name not in history
    for name in EVERY_STEP + FROM_STEP_ONE + VALIDATION:
        assert all(math.isfinite(v) for _, v in history[name]), name

    config = load_run_config(run_dir)
    assert config["algo"]["name"] == "ppo_epo" and config["env"]["eval_splits"] == ["iid", "ood"]
    assert "hub_token" not in config and config["notes"] == f"uses {REDACTED}"
    run_records = [r.run for r in wandb_records(run_file) if r.WhichOneof("record_type") == "run"]
    assert set(run_records[-1].tags) == {"env:gridworld", "algo:ppo_epo", "seed:0"}
    metrics = {r.metric.glob_name or r.metric.name: r.metric for r in wandb_records(run_file) if r.HasField("metric")}
    assert metrics["val/iid/success"].summary.max and metrics["entropy/*"].summary.last
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path

    turn_rows = [json.loads(line) for line in (run_dir / "turn_entropy.jsonl").read_text().splitlines()]
    assert [r["step"] for r in turn_rows] == [0, 1]
    assert all(len(r["entropy"]) == cfg.env.max_turns and all(v > 0 for v in r["entropy"]) for r in turn_rows)
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [0, 0, 1, 1]
    turn = samples[0]["turns"][0]
    assert set(turn) >= {"prompt", "response", "action", "observation", "reward"}
    assert samples[0]["task"] in turn["prompt"] and isinstance(samples[0]["won"], bool)


def test_wandb_reader_joins_records_split_across_blocks(tmp_path, wandb_env):
    """A config value larger than a 32 KiB leveldb block is written as FIRST/MIDDLE/LAST fragments."""
    import wandb

    big = "x" * 100_000
    run = wandb.init(project="p", dir=str(tmp_path), mode="offline", config={"big": big, "seed": 3})
    run.log({"a": 1.5})
    run.log({"a": 2.5})
    run.finish()
    wait_for_exit_record(tmp_path)
    assert load_run_config(tmp_path) == {"big": big, "seed": 3}
    assert load_history(tmp_path)["a"] == [(0, 1.5), (1, 2.5)]


def test_run_id_is_a_function_of_the_run_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run_id("runs/a") == run_id(str(tmp_path / "runs" / "a")) != run_id("runs/b")
    assert len(run_id("runs/a")) == 16


def test_run_tags_and_setup_without_wandb_logger_is_a_no_op():
    config = {"env": {"name": "gridworld"}, "algo": {"name": "grpo"}, "seed": 2}
    assert run_tags(config) == ["env:gridworld", "algo:grpo", "seed:2"]

    class NoLoggers:
        loggers: list = []
        is_global_zero = True

    WandbSetup(OmegaConf.create(config)).setup(NoLoggers(), None, "fit")  # must not touch wandb
