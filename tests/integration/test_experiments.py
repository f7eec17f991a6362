"""Every shipped experiment, and the comparison script's algorithm list on its experiment, passes the start checks
(an experiment inherits another's settings: a change to one must not break the other)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from lightning_epo.runtime.config import validate

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = sorted(path.stem for path in (REPO / "conf" / "experiment").glob("*.yaml"))
COMPARISON_ALGOS = re.search(
    r'ALGOS=\$\{ALGOS:-"([^"]+)"\}', (REPO / "scripts" / "gridworld_comparison.sh").read_text()
).group(1).split()


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_passes_the_start_checks(compose_cfg, experiment):
    validate(compose_cfg(f"experiment={experiment}"))


@pytest.mark.parametrize("algo", COMPARISON_ALGOS)
def test_comparison_algorithms_pass_the_start_checks_on_gridworld_long(compose_cfg, algo):
    validate(compose_cfg("experiment=gridworld_long", f"algo={algo}"))


def test_comparison_script_skips_finished_runs_and_evaluations_and_resumes_stopped_runs(tmp_path):
    """The script's train and final-evaluation commands, with a stand-in python that records its arguments,
    makes the run directory, and fails on plotting, which needs real runs: the commands are what is checked."""
    out, calls = tmp_path / "out", tmp_path / "calls"
    for path in ("warm_start/policy/config.json", "ppo/s0/checkpoints/last.ckpt", "ppo/s1/done", "ppo/s1/eval.json"):
        (out / path).parent.mkdir(parents=True, exist_ok=True)
        (out / path).touch()
    fake_python = tmp_path / "python"
    fake_python.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n'
                           'for a in "$@"; do case "$a" in hydra.run.dir=*) mkdir -p "${a#hydra.run.dir=}";; esac; done\n'
                           'case "$1" in train.py) ;; *) exit 1;; esac\n')
    fake_python.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "PY": str(fake_python), "SEEDS": "0 1", "ALGOS": "ppo ppo_epo",
           "ARGS": "env.val_size=50"}  # a quick run's ARGS: the final evaluation's size must still win
    subprocess.run([str(REPO / "scripts" / "gridworld_comparison.sh"), str(out)], env=env, capture_output=True)
    lines = [line for line in calls.read_text().splitlines() if "train.py" in line]
    runs = {line.split("hydra.run.dir=")[1]: line for line in lines if "mode=eval" not in line}
    evals = {line.split("hydra.run.dir=")[1]: line for line in lines if "mode=eval" in line}
    assert sorted(runs) == [str(out / "ppo" / "s0"), str(out / "ppo_epo" / "s0"), str(out / "ppo_epo" / "s1")]
    assert "ckpt_path=last" in runs[str(out / "ppo" / "s0")]
    assert "ckpt_path=last" not in runs[str(out / "ppo_epo" / "s0")]
    assert sorted(evals) == sorted(runs)  # ppo/s1 has its eval.json
    for run, line in evals.items():  # the run's command, its ARGS included, then the evaluation's overrides
        assert line == runs[run].replace(" ckpt_path=last", "").replace(
            " hydra.run.dir", " mode=eval ckpt_path=last env.val_size=300 hydra.run.dir"), line
        assert "env.val_size=50" in line
