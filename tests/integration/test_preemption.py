"""Preemption: SIGTERM (SLURM, Kubernetes) or Ctrl+C ends ``python train.py`` after the current RL step, with
``last.ckpt`` of the last completed step and exit status 128 + the signal's number, and the run resumes exactly."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

from lightning_epo.runtime.run import run
from tests.integration.test_exact_resume import COMPARED, FAST, assert_logged_alike, logged

REPO = Path(__file__).resolve().parents[2]
STEPS = 8
# Preempted runs flush metrics.csv after every step, so that the test sees when a step has completed.
ARGS = [o for o in FAST if not o.startswith("total_steps=")] + [f"total_steps={STEPS}"]


def start_train(tiny_model_path: str, run_dir: Path, *overrides: str, args: list[str] = ARGS) -> subprocess.Popen:
    """``python train.py`` with the fast settings ``args`` in ``run_dir`` (checkpoints every 5 RL steps, as shipped)."""
    return subprocess.Popen(
        [sys.executable, str(REPO / "train.py"), "~experiment", f"model.name_or_path={tiny_model_path}", *args,
         "+logger.flush_logs_every_n_steps=1", f"hydra.run.dir={run_dir}", *overrides],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def completed_steps(run_dir: Path) -> int:
    """The RL steps whose training metrics are in ``metrics.csv`` so far."""
    try:
        with open(run_dir / "csv" / "metrics.csv") as f:
            return len({row["step"] for row in csv.DictReader(f) if row.get("loss/total")})
    except FileNotFoundError:
        return 0


def preempt(tiny_model_path: str, run_dir: Path, signum: int, after_steps: int = 3) -> tuple[int, str]:
    """Start a run, send ``signum`` once ``after_steps`` steps have completed; its exit status and output."""
    process = start_train(tiny_model_path, run_dir)
    deadline = time.monotonic() + 300
    while completed_steps(run_dir) < after_steps and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.poll() is None, process.communicate()[0][-3000:]
    process.send_signal(signum)
    output, _ = process.communicate(timeout=300)
    return process.returncode, output


def checkpoint_step(path: Path) -> int:
    return torch.load(path, map_location="cpu", weights_only=False)["rl_state"]["rl_step"]


def test_sigterm_saves_the_last_completed_step_exits_143_and_resumes_exactly(tiny_model_path, compose_cfg, tmp_path):
    run_dir = tmp_path / "preempted"
    code, output = preempt(tiny_model_path, run_dir, signal.SIGTERM)

    assert code == 128 + signal.SIGTERM, output[-3000:]
    done = completed_steps(run_dir)
    assert 3 <= done < STEPS, "the run went on to the end"
    assert checkpoint_step(run_dir / "checkpoints" / "last.ckpt") == done
    assert_resumes_exactly(tiny_model_path, compose_cfg, tmp_path, run_dir)


def assert_resumes_exactly(tiny_model_path: str, compose_cfg: Any, tmp_path: Path, run_dir: Path) -> None:
    """``ckpt_path=last`` in the stopped ``run_dir`` finishes, and its steps log what one uninterrupted run logs."""
    resumed = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "~experiment", f"model.name_or_path={tiny_model_path}", *ARGS,
         "ckpt_path=last", f"hydra.run.dir={run_dir}"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    run(compose_cfg(*ARGS, f"run_dir={tmp_path / 'whole'}"))
    whole, split = logged(tmp_path / "whole"), logged(run_dir)
    assert whole.keys() == split.keys() == set(range(STEPS))
    assert_logged_alike(whole, split)


def test_a_sigterm_after_the_checkpoint_hook_looked_still_saves_that_step(tiny_model_path, compose_cfg, tmp_path,
                                                                          monkeypatch):
    """Lightning runs the checkpoint callback's hook last of the callbacks, then the module's (the step line), the
    loggers' write, and only then stops for a signal. A SIGTERM in between (2 ms after a step line, in a check
    of ``train.py total_steps=7``) stopped the run with nothing saved: "no checkpoint was written yet ... start the
    run again", 4 steps lost with checkpoints every 5. The step is saved now, and the resumed run logs what one run
    logs. Sent here from the module's hook after step 3 (in process: no command-line hook runs that late)."""
    from lightning_epo.runtime.preemption import Preemption
    from lightning_epo.training.module import EPOModule

    step_end = EPOModule.on_train_batch_end

    def then_sigterm(module: EPOModule, *args: Any) -> None:
        step_end(module, *args)
        if module.rl_step == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(EPOModule, "on_train_batch_end", then_sigterm)
    run_dir = tmp_path / "preempted"
    with pytest.raises(SystemExit) as stop, Preemption(run_dir):
        run(compose_cfg(*ARGS, f"run_dir={run_dir}"))
    assert stop.value.code == 128 + signal.SIGTERM
    assert checkpoint_step(run_dir / "checkpoints" / "last.ckpt") == 3
    monkeypatch.undo()
    assert_resumes_exactly(tiny_model_path, compose_cfg, tmp_path, run_dir)


class SigtermInStep(L.Callback):
    """Sends the process SIGTERM as its RL step ``at_step`` (0-based) starts, as a cluster may at any moment."""

    def __init__(self, at_step: int) -> None:
        self.at_step = at_step

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        if pl_module.rl_step == self.at_step:
            os.kill(os.getpid(), signal.SIGTERM)


def test_a_run_preempted_before_an_evaluation_stops_without_it_and_plays_it_when_resumed(tiny_model_path, compose_cfg,
                                                                                          tmp_path):
    """A SIGTERM in a step with an evaluation due after it (``test_every=1``): the run used to start the evaluation
    (its first split's episodes, which can take longer than a job's grace period) before it stopped, and the resumed
    run skipped it. Now it stops after the step's checkpoint, and the resumed run plays that evaluation first: every
    evaluation and step logs what an uninterrupted run logs."""
    every_step = [o for o in ARGS if not o.startswith(("test_every=", "total_steps="))] + ["test_every=1", "total_steps=4"]
    run_dir = tmp_path / "preempted"
    signal_at = ["+callbacks.term._target_=tests.integration.test_preemption.SigtermInStep", "+callbacks.term.at_step=2"]
    process = start_train(tiny_model_path, run_dir, *signal_at, args=every_step)
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert checkpoint_step(run_dir / "checkpoints" / "last.ckpt") == 3
    assert "evaluation at RL step 2:" in output and "evaluation at RL step 3:" not in output, output[-3000:]

    assert_resume_plays_the_evaluation_first(tiny_model_path, compose_cfg, tmp_path, run_dir, every_step, 3, 4)


def assert_resume_plays_the_evaluation_first(tiny_model_path: str, compose_cfg: Any, tmp_path: Path, run_dir: Path,
                                             args: list[str], stopped_after: int, steps: int) -> None:
    """``ckpt_path=last`` in ``run_dir`` (stopped after ``stopped_after`` RL steps, before their evaluation ended)
    plays that evaluation first and finishes; its ``steps`` steps and evaluations log what one run logs."""
    resumed = start_train(tiny_model_path, run_dir, "ckpt_path=last", args=args)
    output, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, output[-3000:]
    said = f"the evaluation after {stopped_after} RL steps did not finish before the run stopped"
    assert said in output, output[-3000:]
    run(compose_cfg(*args, f"run_dir={tmp_path / 'whole'}"))
    for compared in (COMPARED, ("val/",)):
        whole, split = logged(tmp_path / "whole", compared), logged(run_dir, compared)
        assert sorted(split) == sorted(whole) == list(range(steps))
        assert_logged_alike(whole, split)


def test_ctrl_c_saves_the_last_completed_step_and_exits_130(tiny_model_path, tmp_path):
    code, output = preempt(tiny_model_path, tmp_path, signal.SIGINT, after_steps=2)

    assert code == 128 + signal.SIGINT, output[-3000:]
    assert "Traceback" not in output
    done = completed_steps(tmp_path)
    assert 2 <= done < STEPS
    assert checkpoint_step(tmp_path / "checkpoints" / "last.ckpt") == done


def test_slurm_requeue_signal_still_reaches_lightning_inside_preemption(monkeypatch):
    """With Lightning's SLURM auto-requeue, its SIGUSR1 handler (save hpc_ckpt, requeue) is installed as without
    Preemption, and its SIGTERM handler passes the signal on to Preemption's."""
    import lightning as L
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    from lightning_epo.runtime.preemption import Preemption

    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_JOB_NAME", "epo")
    with Preemption() as preemption:
        trainer = L.Trainer(accelerator="cpu", devices=1, plugins=[SLURMEnvironment(auto_requeue=True)], logger=False)
        trainer._signal_connector.register_signal_handlers()
        try:
            handlers = signal.getsignal(signal.SIGUSR1).signal_handlers
            assert trainer._signal_connector._slurm_sigusr_handler_fn in handlers
            signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)  # what SLURM sends before the end
            assert trainer.received_sigterm and preemption.signum == signal.SIGTERM
        finally:
            trainer._signal_connector.teardown()


@pytest.mark.parametrize("saved", ["run", "warm_start", "nothing"])
def test_the_stop_advises_what_resumes_where_a_checkpoint_exists(tmp_path, caplog, saved):
    """A SIGTERM during the evaluation before the first step (val_at_start) stopped a run that had saved nothing, and
    "resume with ckpt_path=last" then failed: with no checkpoint the advice is to start again. A stop inside a warm
    start (8 of its 10 SFT steps checkpointed in RUN_DIR/warm_start/checkpoints) said "no checkpoint was written yet":
    the same command resumes that stage from its checkpoint, and the line says so."""
    from lightning_epo.runtime.preemption import Preemption

    where = {"run": tmp_path / "checkpoints", "warm_start": tmp_path / "warm_start" / "checkpoints"}.get(saved)
    if where is not None:
        where.mkdir(parents=True)
        (where / "last.ckpt").write_bytes(b"")
    stop = Preemption(tmp_path)
    stop.signum = signal.SIGTERM
    with pytest.raises(SystemExit) as exit_info:
        stop.__exit__(SystemExit, SystemExit(), None)
    assert exit_info.value.code == 143
    (line,) = [r.getMessage() for r in caplog.records if "stopped by SIGTERM" in r.getMessage()]
    assert ("resume with ckpt_path=last" in line) == (saved == "run")
    assert ("the warm start resumes from" in line and str(where) in line) == (saved == "warm_start")
    assert ("start the run again" in line) == (saved == "nothing")


# An evaluation that lasts well beyond the signal's delay (0.2 s): the random tiny model never wins, so each of a
# split's 16 episodes plays to the turn limit (two splits, about 5 s each on a 2-core AVX2 CPU, 0.5-0.9 s on an
# AVX-512 one with AMX, where a delay of 1 s sent the signal after the evaluation and two of these tests failed).
LONG_EVALUATION = ["env.val_size=16", "env.max_turns=8"]


def signal_in_evaluation(process: subprocess.Popen, at_step: int, signum: int, delay_s: float = 0.2
                         ) -> tuple[int, str, float]:
    """Read ``process``'s output until it starts playing the evaluation at RL step ``at_step``, send ``signum``
    ``delay_s`` later; its exit status, whole output and the seconds from the signal to its exit."""
    seen = []
    for line in process.stdout:
        seen.append(line)
        if f"evaluation at RL step {at_step}: playing" in line:
            break
    assert process.poll() is None, "".join(seen)[-3000:]
    time.sleep(delay_s)
    process.send_signal(signum)
    sent = time.monotonic()
    rest, _ = process.communicate(timeout=300)
    return process.returncode, "".join(seen) + rest, time.monotonic() - sent


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl+C"])
def test_a_signal_in_the_first_evaluation_stops_it_within_seconds(tiny_model_path, tmp_path, signum):
    """The evaluation before the first step (``val_at_start``) used to go on playing its episodes after a SIGTERM
    (minutes to an hour, past a job's grace period: SIGKILL). Now it stops between two turns, with no result."""
    args = [*ARGS, "val_at_start=true", *LONG_EVALUATION]
    code, output, seconds = signal_in_evaluation(start_train(tiny_model_path, tmp_path, args=args), 0, signum)
    assert code == 128 + signum, output[-3000:]
    assert seconds < 30, f"stopped {seconds:.0f} s after the signal"
    assert "evaluation at RL step 0: val/" not in output and "Traceback" not in output, output[-3000:]
    assert "start the run again" in output and not (tmp_path / "checkpoints" / "last.ckpt").exists()


def test_a_sigterm_after_the_first_evaluations_last_turn_still_stops_the_run(tiny_model_path, compose_cfg, tmp_path,
                                                                             monkeypatch):
    """A SIGTERM after the evaluation before the first step had played its last episode (its report's hook, the
    teardown) set Lightning's flag for that evaluation; fit, which follows, set it back, and the run trained to its
    end and exited 0. Seen on a CPU where that evaluation ended within a second of its start. Now the run stops
    before its first step, 143. Sent here as the evaluation's success is reported (in process)."""
    from lightning_epo.callbacks.success_report import SuccessReport
    from lightning_epo.runtime.preemption import Preemption

    report = SuccessReport.on_validation_end

    def then_sigterm(callback: SuccessReport, *args: Any) -> None:
        report(callback, *args)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(SuccessReport, "on_validation_end", then_sigterm)
    with pytest.raises(SystemExit) as stop, Preemption(tmp_path):
        run(compose_cfg(*ARGS, "val_at_start=true", f"run_dir={tmp_path}"))
    assert stop.value.code == 128 + signal.SIGTERM
    assert completed_steps(tmp_path) == 0 and not (tmp_path / "checkpoints" / "last.ckpt").exists()


def test_a_sigterm_in_the_evaluation_after_a_step_keeps_the_step_and_the_resume_plays_it(tiny_model_path, compose_cfg,
                                                                                          tmp_path):
    """A SIGTERM 0.2 s into the evaluation after RL step 1 (``test_every=1``; checkpoints every 5 steps): the process
    ends within seconds with 143, ``last.ckpt`` holds step 1 (written before the evaluation), and the resumed run plays
    that evaluation from its start and finishes, logging what an uninterrupted run logs."""
    args = [o for o in ARGS if not o.startswith(("test_every=", "total_steps="))] + [
        "test_every=1", "total_steps=2", *LONG_EVALUATION]
    run_dir = tmp_path / "preempted"
    code, output, seconds = signal_in_evaluation(start_train(tiny_model_path, run_dir, args=args), 1, signal.SIGTERM)
    assert code == 128 + signal.SIGTERM, output[-3000:]
    assert seconds < 30, f"stopped {seconds:.0f} s after the signal"
    assert "evaluation at RL step 1: val/" not in output, output[-3000:]
    assert checkpoint_step(run_dir / "checkpoints" / "last.ckpt") == 1

    assert_resume_plays_the_evaluation_first(tiny_model_path, compose_cfg, tmp_path, run_dir, args, 1, 2)


def test_a_sigterm_in_an_evaluation_of_mode_eval_writes_no_result(tiny_model_path, tmp_path):
    code, output, seconds = signal_in_evaluation(
        start_train(tiny_model_path, tmp_path, "mode=eval", args=[*ARGS, *LONG_EVALUATION]), 0, signal.SIGTERM)
    assert code == 128 + signal.SIGTERM, output[-3000:]
    assert seconds < 30, f"stopped {seconds:.0f} s after the signal"
    assert not (tmp_path / "eval.json").exists()
