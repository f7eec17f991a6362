"""Secrets planted in the environment, in a config interpolation and on the command line reach no file of a run
(DESIGN.md "Safety"): two RL steps of ``python train.py``, with logger=csv and with offline wandb."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HF_TOKEN = "hf_" + "PlantedEnvToken0123456789abcdefXYZ"
WANDB_API_KEY = "0123456789abcdef" * 2 + "01234567"  # 40 hex digits, as wandb's keys
LITERAL_TOKEN = "sk-" + "plantedLiteralKey0123456789"  # typed on the command line
LITERAL_PASSWORD = "correct-horse-battery"  # an ordinary-looking value under a secret-named key
SECRETS = (HF_TOKEN, WANDB_API_KEY, LITERAL_TOKEN, LITERAL_PASSWORD)
FAST = ["~experiment", "debug=fast", "~callbacks.progress_bar", "test_every=1000", "total_steps=2",  # as test_exact_resume
        "data.episodes_per_step=2", "env.max_turns=2", "rollout.max_new_tokens=8"]


def file_contents(root: Path):
    """``(path, bytes)`` of every file under ``root``, and of every member of a zip file (a Lightning checkpoint)."""
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                for name in archive.namelist():
                    yield f"{path}:{name}", archive.read(name)
        yield str(path), path.read_bytes()


@pytest.mark.parametrize("logger", ["csv", "wandb"])
def test_no_secret_reaches_any_file_of_the_run(tiny_model_path, tmp_path, logger):
    run_dir = tmp_path / "run"
    env = {**os.environ, "HF_TOKEN": HF_TOKEN, "WANDB_API_KEY": WANDB_API_KEY, "WANDB_MODE": "offline",
           "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1"}
    for name in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        env[name] = str(run_dir / "wandb_home")  # wandb's own files in the run directory too: searched below
    result = subprocess.run(
        [sys.executable, str(REPO / "train.py"), *FAST, f"logger={logger}", f"model.name_or_path={tiny_model_path}",
         "+model.token=${oc.env:HF_TOKEN}", f"+model.api_key={LITERAL_TOKEN}", f"+model.password={LITERAL_PASSWORD}",
         f"hydra.run.dir={run_dir}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]

    searched = dict(file_contents(run_dir))
    expected = {".hydra/config.yaml", ".hydra/overrides.yaml", ".hydra/hydra.yaml", "checkpoints/last.ckpt",
                "csv/hparams.yaml" if logger == "csv" else ".wandb"}  # offline: config, args in .wandb
    assert all(any(path.endswith(name) for path in searched) for name in expected), sorted(searched)
    leaks = [(path, secret) for path, data in searched.items() for secret in SECRETS if secret.encode() in data]
    assert not leaks, leaks


COMMAND_LINE_TOKEN = "hf_" + "PlantedCommandLineToken0123456789"


def test_a_multirun_leaves_no_secret_in_its_sweep_directory_or_its_log_lines(tiny_model_path, tmp_path):
    """Hydra saves the sweep's config and command line (``multirun.yaml``) and each job's ``.hydra`` before any job
    code runs, and logs each job's overrides (a job script's output file keeps them); the jobs here are refused at
    start (a bad total_steps), which keeps the test short."""
    sweep = tmp_path / "sweep"
    result = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "-m", *FAST, f"model.name_or_path={tiny_model_path}", "seed=0,1",
         f"+model.token={COMMAND_LINE_TOKEN}", "total_steps=abc", f"hydra.sweep.dir={sweep}"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    searched = dict(file_contents(sweep))
    assert any(path.endswith("multirun.yaml") for path in searched) and any("/.hydra/" in path for path in searched)
    assert not [path for path, data in searched.items() if COMMAND_LINE_TOKEN.encode() in data]
    assert "#0 : " in result.stdout and COMMAND_LINE_TOKEN not in result.stdout + result.stderr


def test_a_sigterm_right_after_hydra_saved_the_config_leaves_no_secret(tiny_model_path, tmp_path):
    """The signal arrives as soon as ``.hydra`` appears (before the run's own code, as a scheduler that cancels a job
    at once would): the run stops with 143 and the saved files hold no secret."""
    run_dir = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, str(REPO / "train.py"), *FAST, f"model.name_or_path={tiny_model_path}",
         f"+model.token={COMMAND_LINE_TOKEN}", f"hydra.run.dir={run_dir}"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while not (run_dir / ".hydra").exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=120) == 143
    searched = dict(file_contents(run_dir))
    assert any("/.hydra/" in path for path in searched)
    assert not [path for path, data in searched.items() if COMMAND_LINE_TOKEN.encode() in data]
