"""Secrets planted in the environment, in a config interpolation and on the command line reach no file of a run
(DESIGN.md "Safety"): two RL steps of ``python train.py``, with logger=csv and with offline wandb."""

from __future__ import annotations

import os
import subprocess
import sys
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
