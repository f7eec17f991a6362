"""``--keep``: a comparison's finished seeds kept without checkpoints and copied back into a fresh ``--out`` (a new
checkout), where they count as finished, are not rerun, and report as they did; an unfinished seed is not kept."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest
import torch
import yaml

from lightning_epo.core.errors import UserError
from lightning_epo.reports.comparison.plan import Plan, finished, run_dir
from lightning_epo.reports.comparison.records import (check_kept_runs_share_the_warm_start, keep_finished,
                                                      restore_kept, write_history_csv)
from lightning_epo.reports.comparison.report import report
from lightning_epo.reports.compare import compare
from lightning_epo.reports.run_history import load_history
from tests.reports.test_comparison_report import plant_run, wins_of

ARMS = {"grpo": ["algo=grpo"], "epo": ["algo=grpo_epo"]}  # real overrides: compare() composes every run's config


def plan_at(tmp_path, seeds, arms=ARMS):
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump({"experiment": "smollm2_gridworld", "seeds": seeds, "control": "control",
                                    "arms": arms}, sort_keys=False))
    return path, Plan.read(path)


def plant_last_checkpoint(out, arm, seed):
    """The checkpoint Lightning writes after a run's last step (its epoch closed): the run has finished."""
    (run_dir(out, arm, seed) / "checkpoints").mkdir()
    torch.save({"loops": {"fit_loop": {"epoch_progress": {"current": {"completed": 1}}}}, "rl_state": {"rl_step": 2}},
               run_dir(out, arm, seed) / "checkpoints" / "last.ckpt")


def plant_finished(out, seed, wins, arm_finished=True):
    """The seed's two arms (a checkpoint written after their last step, as Lightning's closes the epoch), its
    control (eval.json and its episodes), its warm start, and their lines of timings.tsv and commands.txt."""
    for arm in ARMS:
        plant_run(out, arm, seed, {"iid": wins_of(wins[arm]), "ood": wins_of(wins[arm])})
        if arm_finished or arm == "grpo":
            plant_last_checkpoint(out, arm, seed)
        else:
            (run_dir(out, arm, seed) / "checkpoints").mkdir()
    control = run_dir(out, "control", seed)
    control.mkdir(parents=True)
    (control / "eval.json").write_text(json.dumps({f"val/{s}/{m}": v for s in ("iid", "ood")
                                                   for m, v in (("success", 5 / 20), ("episodes", 20))}))
    (control / "eval_episodes.jsonl").write_text("".join(
        json.dumps({"mode": "eval", "after_rl_steps": 0, "split": s, "place": i, "task": f"t{i}", "won": bool(w),
                    "return": 0.0, "turns": 3, "truncated": False}) + "\n"
        for s in ("iid", "ood") for i, w in enumerate(wins_of(5))))
    plant_run(out, "warm_start", seed, {"iid": wins_of(1), "ood": wins_of(1)})  # DIR/warm_start/s<seed>: a run
    with open(out / "timings.tsv", "a") as timings, open(out / "commands.txt", "a") as commands:
        for arm in (*ARMS, "control"):
            timings.write(f"{arm}\t{seed}\t2026-12-02T04:23:0{seed}\t{60.0 * (seed + 1)}\t0\n")
            commands.write(f"python train.py seed={seed} hydra.run.dir={run_dir(out, arm, seed)}\n")


def test_a_finished_seed_is_kept_without_checkpoints_and_restored_into_a_fresh_out_as_finished(tmp_path):
    out, keep = tmp_path / "outputs" / "cmp", tmp_path / "docs" / "records" / "plan"
    _, plan = plan_at(tmp_path, [0, 1])
    plant_finished(out, 0, {"grpo": 6, "epo": 9})
    plant_finished(out, 1, {"grpo": 7, "epo": 8}, arm_finished=False)  # epo s1 stopped mid-run: seed 1 unfinished
    before = report(plan.with_seeds([0]), out)

    assert keep_finished(plan, out, keep) == [0]
    assert keep_finished(plan, out, keep) == []  # kept once
    assert sorted(p.name for p in keep.iterdir()) == ["commands.txt", "control", "epo", "grpo", "timings.tsv",
                                                       "warm_start"]
    assert not list(keep.rglob("*.ckpt")) and not (keep / "grpo" / "s1").exists()
    assert (keep / "warm_start" / "s0" / "csv" / "metrics.csv").is_file()
    assert [line.split("\t")[:2] for line in (keep / "timings.tsv").read_text().splitlines()] == [
        ["grpo", "0"], ["epo", "0"], ["control", "0"]]
    assert len((keep / "commands.txt").read_text().splitlines()) == 3

    shutil.rmtree(out)  # the next session's checkout: the same --out, empty
    assert restore_kept(plan, out, keep) == [0]
    assert all(finished(plan, out, arm, 0) for arm in plan.compared)
    assert not any(finished(plan, out, arm, 1) for arm in plan.compared)
    assert report(plan.with_seeds([0]), out) == before  # the same tables, wall times and commands
    assert restore_kept(plan, out, keep) == []  # a seed already in --out is left alone


def test_compare_with_keep_skips_the_kept_seeds_of_a_fresh_out_and_reports_them(tmp_path, capsys):
    out, keep = tmp_path / "outputs" / "cmp", tmp_path / "records"
    path, plan = plan_at(tmp_path, [0])
    plant_finished(out, 0, {"grpo": 6, "epo": 9})
    assert keep_finished(plan, out, keep) == [0]
    shutil.rmtree(out)
    written = compare(path, out, python="/nonexistent/python", keep=keep)  # nothing to run: no interpreter needed
    printed = capsys.readouterr().out
    assert f"seed 0: its finished runs copied back from {keep}" in printed
    assert all(f"{arm} s0: finished, skipped" in printed for arm in plan.compared)
    assert "| epo - control | +0.200 |" in written.read_text()


def test_the_kept_history_reads_back_value_for_value(tmp_path):
    history = {"train/success": [(0, 0.1 + 0.2), (3, 1 / 3)], "val/iid/success": [(3, 1e-17)],
               "loss/entropy": [(1, -2.5e-06), (2, 123456.789012345)]}
    write_history_csv(history, tmp_path / "csv" / "metrics.csv")
    assert load_history(tmp_path) == history


def test_a_seed_is_kept_as_soon_as_it_finishes_before_the_next_seed_runs(tmp_path):
    """A session that ends mid-way through seed 1 (its processes killed, no ``finally``) must not lose seed 0: the
    fake interpreter of seed 1's first run sees whether seed 0 is already in ``--keep``."""
    out, keep, seen = tmp_path / "outputs" / "cmp", tmp_path / "records", tmp_path / "seen"
    path, _ = plan_at(tmp_path, [0, 1])
    plant_finished(out, 0, {"grpo": 6, "epo": 9})
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\n[ -d {keep}/grpo/s0 ] && echo kept > {seen} || echo missing > {seen}\nexit 3\n")
    python.chmod(0o755)
    with pytest.raises(UserError, match="grpo s1 exited 3"):
        compare(path, out, python=str(python), keep=keep)
    assert seen.read_text() == "kept\n"


def test_a_plan_that_adds_an_arm_to_kept_seeds_restores_their_kept_runs_and_keeps_only_its_new_arm(tmp_path):
    """Two plans sharing one records folder (a new arm beside arms kept by an earlier plan): a fresh ``--out`` gets
    the kept runs back as finished, so only the new arm runs; once it finishes, it alone is added, and the warm start
    kept with the seed stays the one it was kept with."""
    out, keep = tmp_path / "outputs" / "cmp", tmp_path / "records"
    _, plan = plan_at(tmp_path, [0])
    plant_finished(out, 0, {"grpo": 6, "epo": 9})
    assert keep_finished(plan, out, keep) == [0]
    kept_warm_start = (keep / "warm_start" / "s0" / "csv" / "metrics.csv").read_text()
    shutil.rmtree(out)
    _, plan = plan_at(tmp_path, [0], arms={**ARMS, "cool": ["algo=grpo_epo", "data.train_sampling.temperature=0.4"]})

    assert restore_kept(plan, out, keep) == [0]
    assert sorted(arm for arm in plan.compared if finished(plan, out, arm, 0)) == ["control", "epo", "grpo"]
    assert not run_dir(out, "cool", 0).exists()
    assert keep_finished(plan, out, keep) == []  # the new arm has not run

    plant_run(out, "cool", 0, {"iid": wins_of(8), "ood": wins_of(8)})
    plant_last_checkpoint(out, "cool", 0)
    plant_run(out, "warm_start", 0, {"iid": wins_of(2), "ood": wins_of(2)})  # trained again by the new checkout
    with open(out / "timings.tsv", "a") as timings:
        timings.write("cool\t0\t2026-12-07T02:00:00\t1800.0\t0\n")
    assert keep_finished(plan, out, keep) == [0]
    assert (keep / "cool" / "s0" / "eval_episodes.jsonl").is_file()
    assert (keep / "warm_start" / "s0" / "csv" / "metrics.csv").read_text() == kept_warm_start
    assert [line.split("\t")[:2] for line in (keep / "timings.tsv").read_text().splitlines()] == [
        ["grpo", "0"], ["epo", "0"], ["control", "0"], ["cool", "0"]]


def plant_machine(directory, precision):
    """The line a run's start appends to its ``machines.jsonl`` (runtime/machine_record.py), the precision alone."""
    with open(directory / "machines.jsonl", "a") as file:
        file.write(json.dumps({"precision": precision}) + "\n")


def test_a_seed_kept_in_bf16_is_refused_at_start_where_its_commands_resolve_to_float32(tmp_path, monkeypatch):
    """The recipes pick their precision by the CPU (``${native_bf16:bf16-mixed,32-true}``): a plan adding an arm to
    seeds kept on a native-bf16 CPU, run on an AVX2 one, would train its arm in float32 and pair it with bf16 runs.
    One line before anything runs, naming the runs and both precisions; where bf16 is native the seed runs."""
    from lightning_epo.runtime import config

    out, keep, ran = tmp_path / "outputs" / "cmp", tmp_path / "records", tmp_path / "ran"
    _, plan = plan_at(tmp_path, [0])
    plant_finished(out, 0, {"grpo": 6, "epo": 9})
    for directory in [run_dir(out, arm, 0) for arm in plan.compared] + [run_dir(out, "warm_start", 0)]:
        plant_machine(directory, "bf16-mixed")
    assert keep_finished(plan, out, keep) == [0]
    assert (keep / "warm_start" / "s0" / "machines.jsonl").is_file()
    shutil.rmtree(out)  # a new checkout
    path, _ = plan_at(tmp_path, [0], arms={**ARMS, "cool": ["algo=grpo_epo", "data.train_sampling.temperature=0.4"]})
    python = tmp_path / "python"  # what a run would start: it leaves a mark, then fails
    python.write_text(f"#!/bin/sh\ntouch {ran}\nexit 3\n")
    python.chmod(0o755)

    monkeypatch.setattr(config, "cpu_computes_bf16", lambda: False)
    with pytest.raises(UserError, match=r"^seed 0: control, grpo and epo ran in bf16-mixed where this machine "
                                        r"resolves their commands to 32-true: .*python -m lightning_epo.doctor"):
        compare(path, out, python=str(python), keep=keep)
    run_dir(out, "warm_start", 0).mkdir(parents=True)  # a warm start this --out trained earlier, in bf16
    plant_machine(run_dir(out, "warm_start", 0), "bf16-mixed")
    with pytest.raises(UserError, match=r"^seed 0: control, grpo, epo and warm_start ran in bf16-mixed"):
        compare(path, out, python=str(python), keep=keep)
    assert not ran.exists()

    monkeypatch.setattr(config, "cpu_computes_bf16", lambda: True)
    with pytest.raises(UserError, match="cool s0 exited 3"):
        compare(path, out, python=str(python), keep=keep)
    assert ran.exists()


def test_the_compare_command_refuses_a_seed_of_another_precision_in_one_line(tmp_path):
    """The command as a user runs it, in a process of its own (the tests' process has registered the config's
    resolvers by importing the runtime; the command must do so itself): a kept seed recorded in a precision this
    machine resolves no command to is refused, one line, no traceback, nothing run."""
    out, keep = tmp_path / "outputs" / "cmp", tmp_path / "records"
    path, plan = plan_at(tmp_path, [0])
    plant_finished(out, 0, {"grpo": 6, "epo": 9})
    for arm in plan.compared:
        plant_machine(run_dir(out, arm, 0), "16-mixed")
    keep_finished(plan, out, keep)
    shutil.rmtree(out)
    _, plan = plan_at(tmp_path, [0], arms={**ARMS, "cool": ["algo=grpo_epo", "data.train_sampling.temperature=0.4"]})
    done = subprocess.run([sys.executable, "-m", "lightning_epo.reports.compare", str(path), "--out", str(out),
                           "--python", "/nonexistent/python", "--keep", str(keep)], capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert re.search(r"seed 0: control, grpo and epo ran in 16-mixed where this machine resolves their commands to "
                     r"(32-true|bf16-mixed): a seed's runs pair only in one precision", done.stderr), done.stderr
    assert not run_dir(out, "cool", 0).exists()


def plant_sft_losses(run, losses):
    """The warm start's history with its SFT loss at each step (``loss/policy``), as its run logs it."""
    history = load_history(run)
    history["loss/policy"] = list(enumerate(losses))
    shutil.rmtree(run / "csv")
    write_history_csv(history, run / "csv" / "metrics.csv")


def kept_seed_with_a_new_arm(tmp_path, retrained):
    """Seed 0 kept with its warm start's SFT losses 1.25, 0.5; then a fresh checkout's plan adds an arm, its kept runs
    copied back, and the new arm finished from the warm start it trained again, which logged ``retrained``."""
    out, keep = tmp_path / "outputs" / "cmp", tmp_path / "records"
    _, plan = plan_at(tmp_path, [0])
    plant_finished(out, 0, {"grpo": 6, "epo": 9})
    plant_sft_losses(run_dir(out, "warm_start", 0), [1.25, 0.5])
    assert keep_finished(plan, out, keep) == [0]
    shutil.rmtree(out)
    path, plan = plan_at(tmp_path, [0], arms={**ARMS, "cool": ["algo=grpo_epo", "data.train_sampling.temperature=0.4"]})
    assert restore_kept(plan, out, keep) == [0]
    plant_run(out, "cool", 0, {"iid": wins_of(8), "ood": wins_of(8)})  # the new arm, finished ...
    plant_last_checkpoint(out, "cool", 0)
    plant_run(out, "warm_start", 0, {"iid": wins_of(1), "ood": wins_of(1)})  # ... from the warm start it trained
    plant_sft_losses(run_dir(out, "warm_start", 0), retrained)
    return path, plan, out, keep


def test_a_new_arm_is_kept_beside_kept_runs_whose_warm_start_was_trained_again_to_the_same_sft_losses(tmp_path):
    """Where the warm start trained again logged the kept one's SFT losses (so far, or at every step), the new arm is
    kept beside the kept runs."""
    path, plan, out, keep = kept_seed_with_a_new_arm(tmp_path, [1.25])  # stopped after its first step: the same so far
    check_kept_runs_share_the_warm_start(plan, out, keep, 0)
    plant_sft_losses(run_dir(out, "warm_start", 0), [1.25, 0.5])
    compare(path, out, python="/nonexistent/python", keep=keep)  # nothing to run
    assert (keep / "cool" / "s0" / "eval_episodes.jsonl").is_file()


def test_a_seed_whose_warm_start_was_trained_again_to_other_sft_losses_is_refused_and_not_kept(tmp_path):
    """The kept control and arms started from the first warm start: where the new one logged other SFT losses, the
    seed is refused in one line naming its kept runs, and not kept (its records would pair runs of two warm starts)."""
    path, _, out, keep = kept_seed_with_a_new_arm(tmp_path, [1.25, 0.5001])
    with pytest.raises(UserError) as refused:
        compare(path, out, python="/nonexistent/python", keep=keep)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("seed 0: ")
    assert "loss/policy at step 1: 0.5001 here, 0.5 kept" in message
    assert "): control, grpo, epo do not pair with the runs made here" in message
    assert "another --out and --keep" in message
    assert not (keep / "cool").exists()
