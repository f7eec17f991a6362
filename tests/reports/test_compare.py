"""The paired comparison tool in miniature: 2 arms x 2 seeds x 2 RL steps of the tiny model, the warm start trained
once per seed and shared by both arms, a stopped run resumed, finished runs skipped, one paired report."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys

import pytest
import yaml

from lightning_epo.core.errors import UserError
from lightning_epo.reports.compare import compare
from lightning_epo.reports.comparison.plan import Plan, run_dir
from lightning_epo.reports.comparison.report import report as report_of
from lightning_epo.reports.comparison.report import status
from lightning_epo.reports.comparison.runner import command, link_warm_start
from lightning_epo.reports.run_history import load_run, wandb_records, wandb_run_files
from lightning_epo.reports.paired import NO_SPREAD

SHRUNK = ["total_steps=2", "test_every=2", "val_at_start=false", "env.val_size=4", "env.max_turns=3",
          "data.episodes_per_step=8", "data.oversample=1", "rollout.max_new_tokens=8", "~callbacks.progress_bar",
          "warm_start.overrides=['total_steps=2','test_every=2','env.val_size=2']"]


def write_plan(path, tiny_model_path, arms, contrasts=(), seeds=(0, 1), control=None):
    path.write_text(yaml.safe_dump({"experiment": "gridworld_learn", "seeds": list(seeds),
                                    "common": [f"model.name_or_path={tiny_model_path}", *SHRUNK], "arms": arms,
                                    "contrasts": [list(pair) for pair in contrasts], "control": control},
                                   sort_keys=False))
    return path


def test_two_arms_two_seeds_share_each_seeds_warm_start_resume_a_stopped_run_and_report_paired(tiny_model_path,
                                                                                                 tmp_path):
    plan_path = write_plan(tmp_path / "plan.yaml", tiny_model_path, {"ppo": ["algo=ppo"], "ppo_epo": ["algo=ppo_epo"]},
                           contrasts=[("ppo", "ppo_epo")])
    out = tmp_path / "cmp"
    plan = Plan.read(plan_path)
    link_warm_start(out, "ppo", 0)  # a run stopped after its first step, as a session's end leaves it
    stopped = [*command(plan, out, "ppo", 0, sys.executable), "stop_at_step=1"]
    assert subprocess.run(stopped, capture_output=True, text=True).returncode == 0
    before = status(plan, out)
    assert "| 0 | ppo | RL step 1 checkpointed | - | - | - |" in before
    assert before.count("| not started | - | - | - |") == 3

    report = compare(plan_path, out).read_text()

    commands = (out / "commands.txt").read_text().splitlines()
    assert len(commands) == 4 and "ckpt_path=last" in commands[0] and "ckpt_path=last" not in "".join(commands[1:])
    for seed in (0, 1):  # one warm start per seed, trained by the seed's first run, reused by the other arm
        assert (out / "warm_start" / f"s{seed}" / "policy" / "config.json").is_file()
        logs = [(run_dir(out, arm, seed) / "compare.log").read_text() for arm in ("ppo", "ppo_epo")]
        assert sum("warm start: python train.py" in log for log in logs) == (0 if seed == 0 else 1)
        assert "warm start: reusing the policy" in logs[1]
    assert "| ppo_epo | algo=ppo_epo |" in report
    assert "## IID: paired differences (against ppo, then the plan's contrasts)" in report
    paired = paired_rows(report, "paired")
    assert len(paired) == 4, report  # IID and OOD: against the baseline, then the contrast (the same runs, reversed)
    for split, (against_baseline, contrast) in zip(("iid", "ood"), (paired[:2], paired[2:])):
        assert against_baseline[0] == "ppo_epo - ppo" and contrast[0] == "ppo - ppo_epo"
        finals = {arm: [load_run(run_dir(out, arm, seed)).history[f"val/{split}/success"][-1][1] for seed in (0, 1)]
                  for arm in ("ppo", "ppo_epo")}  # the per-seed differences are the final rates' (4 paired episodes)
        assert [float(x) for x in against_baseline[1:3]] == pytest.approx(
            [a - b for a, b in zip(finals["ppo_epo"], finals["ppo"])], abs=5e-4)
        numbers, mirrored = (numbers_of(row) for row in (against_baseline, contrast))  # s0, s1, mean, t-interval,
        assert mirrored[:3] == pytest.approx([-x for x in numbers[:3]], abs=1e-9)     # detectable, evaluation noise
        assert [mirrored[-2], mirrored[-1]] == pytest.approx([-numbers[-1], -numbers[-2]], abs=1e-9)  # exact mirror
        if len(numbers) == 8:  # a spread over the seeds: the t-interval, mirrored, around the mean, and δ
            assert [mirrored[3], mirrored[4]] == pytest.approx([-numbers[4], -numbers[3]], abs=1e-9)
            assert mirrored[5] == numbers[5] and numbers[3] <= numbers[2] <= numbers[4]
        else:  # the same difference at both seeds: no interval over seeds, no detectable difference
            assert numbers[0] == pytest.approx(numbers[1], abs=1e-12) and against_baseline[4] == NO_SPREAD
    for arm in ("ppo", "ppo_epo"):  # every final evaluation's episodes recorded, per split and place
        for seed in (0, 1):
            rows = (run_dir(out, arm, seed) / "eval_episodes.jsonl").read_text().splitlines()
            assert len(rows) == 8 and all('"after_rl_steps": 2' in row for row in rows)
    assert "entropy_turns.png" in report
    early_table = report.split("### Early-turn entropy")[1].split("###")[0]
    for arm in ("ppo", "ppo_epo"):  # the figures' curves as numbers: each step's mean over the two seeds
        early = [load_run(run_dir(out, arm, seed)).history["entropy/early_turns"] for seed in (0, 1)]
        means = [f"{statistics.fmean([y0, y1]):.3f}" for (_, y0), (_, y1) in zip(*early)]
        assert len(means) == 2 and f"| {arm} | {' | '.join(means)} |" in early_table, early_table
    for arm in ("ppo", "ppo_epo"):  # wandb (offline): one group per arm, its seeds side by side
        for seed in (0, 1):
            runs = [r.run for f in wandb_run_files(run_dir(out, arm, seed)) for r in wandb_records(f)
                    if r.WhichOneof("record_type") == "run"]
            assert {(r.run_group, r.display_name) for r in runs} == {(f"plan-{arm}", f"{arm}-s{seed}")}

    after = status(plan, out)  # each run's wall time and final success, as the report's pooled rates are made of them
    rate = r"\d+\.\d \[[\d.]+, [\d.]+\], n=4"
    assert len(re.findall(rf"\| finished \| \d+\.\d min \| {rate} \| {rate} \|", after)) == 4, after
    timed = [line.split("\t")[:2] for line in (out / "timings.tsv").read_text().splitlines()]
    assert timed == [["ppo", "0"], ["ppo_epo", "0"], ["ppo", "1"], ["ppo_epo", "1"]]
    assert re.search(r"\| ppo_epo \| \d+\.\d min \| \d+\.\d min \|", report) and "All runs: " in report

    assert compare(plan_path, out).read_text() == report  # finished runs are skipped: nothing runs again
    assert (out / "commands.txt").read_text().splitlines() == commands

    # A second plan sharing the folder (its seeds' warm starts): its own report and figures, the first plan's kept;
    # each report's total counts its own plan's runs only (a run of another plan, 10 minutes, is in timings.tsv).
    with (out / "timings.tsv").open("a") as timings, (out / "commands.txt").open("a") as ran:
        timings.write("other_arm\t0\t2026-11-28T00:00:00\t600.0\t0\n")
        ran.write(f"python train.py hydra.run.dir={run_dir(out, 'other_arm', 0)}\n")
    reversed_plan = write_plan(tmp_path / "reversed.yaml", tiny_model_path,
                               {"ppo_epo": ["algo=ppo_epo"], "ppo": ["algo=ppo"]})
    second = compare(reversed_plan, out)
    assert second.name == "report-reversed.md" and (out / "report-plan.md").read_text() == report
    assert "Baseline: ppo_epo." in second.read_text() and "figures/reversed/entropy_turns.png" in second.read_text()
    assert "figures/plan/entropy_turns.png" in report and (out / "figures" / "plan" / "entropy_turns.png").is_file()
    totals = [float(re.search(r"All runs: (\d+\.\d) min", text)[1]) for text in (report, second.read_text())]
    assert totals[0] == pytest.approx(totals[1], abs=0.051), totals  # the same four runs, not the other plan's 10 min
    assert "other_arm" not in second.read_text() and all(line in second.read_text() for line in commands)

    # A run without per-episode records (made before them): the same per-seed differences and t-interval, from the
    # rates, and the evaluation-noise interval of unpaired rates
    (run_dir(out, "ppo", 0) / "eval_episodes.jsonl").unlink()
    unpaired = paired_rows(report_of(plan, out), "unpaired")
    assert [row[:6] for row in unpaired] == [row[:6] for row in paired]


def paired_rows(report: str, kind: str) -> list[tuple[str, ...]]:
    """The paired-differences rows of a 2-seed report: arm - other, s0, s1, mean, the t-interval's cell, the smallest
    detectable difference's cell, the evaluation-noise interval (low, high), its ``kind`` (paired, unpaired)."""
    number = r"([+-]\d\.\d{3})"
    return re.findall(rf"\| (ppo_epo - ppo|ppo - ppo_epo) \| {number} \| {number} \| {number} \| ([^|]+) \| "
                      rf"([^|]+) \| \[{number}, {number}\] {kind} \|", report)


def numbers_of(row: tuple[str, ...]) -> list[float]:
    """A :func:`paired_rows` row's numbers: s0, s1, mean, [t-interval low, high, detectable,] evaluation noise."""
    over = [] if row[4] == NO_SPREAD else [*map(float, re.fullmatch(r"\[(.+), (.+)\]", row[4]).groups()), float(row[5])]
    return [float(x) for x in row[1:4]] + over + [float(x) for x in row[6:]]


def test_arms_that_would_train_different_warm_starts_are_refused(tiny_model_path, tmp_path):
    plan_path = write_plan(tmp_path / "plan.yaml", tiny_model_path,
                           {"a": ["algo=ppo"], "b": ["algo=ppo_epo", "env.history_length=0"]})
    with pytest.raises(UserError, match="arms b would train another warm start than a"):
        compare(plan_path, tmp_path / "cmp")


def test_an_arm_name_that_cannot_name_a_run_is_refused(tiny_model_path, tmp_path):
    plan_path = write_plan(tmp_path / "plan.yaml", tiny_model_path, {"a": ["algo=ppo"], "with epo": ["algo=ppo_epo"]})
    with pytest.raises(UserError, match="use letters, digits"):
        Plan.read(plan_path)


def test_a_contrast_of_arms_the_plan_lacks_is_refused(tiny_model_path, tmp_path):
    plan_path = write_plan(tmp_path / "plan.yaml", tiny_model_path, {"a": ["algo=ppo"], "b": ["algo=ppo_epo"]},
                           contrasts=[("b", "c")])
    with pytest.raises(UserError, match=r"each contrast is a pair of the plan's arms \(a, b\); got \[\['b', 'c'\]\]"):
        Plan.read(plan_path)


def test_a_control_evaluates_each_seeds_warm_start_after_its_arms_and_is_the_baseline(tiny_model_path, tmp_path):
    """The control (the warm start's policy evaluated as the arms' final policies are, no RL) runs after the seed's
    arm that trained the warm start, pairs with it per task, is skipped once its evaluation is recorded."""
    plan_path = write_plan(tmp_path / "plan.yaml", tiny_model_path, {"ppo_epo": ["algo=ppo_epo"]}, seeds=[0],
                           control="warm_start_only")
    out = tmp_path / "cmp"
    report = compare(plan_path, out).read_text()
    commands = (out / "commands.txt").read_text().splitlines()
    assert len(commands) == 2 and f"hydra.run.dir={run_dir(out, 'ppo_epo', 0)}" in commands[0].split()
    control = commands[1].split()
    assert {"mode=eval", "warm_start=null", f"model.name_or_path={out / 'warm_start' / 's0' / 'policy'}",
            f"hydra.run.dir={run_dir(out, 'warm_start_only', 0)}"} <= set(control)
    assert control.index(f"model.name_or_path={out / 'warm_start' / 's0' / 'policy'}") > control.index(
        f"model.name_or_path={tiny_model_path}")  # the control's policy, not the common one, is evaluated
    assert "Baseline: warm_start_only." in report
    assert "| warm_start_only | the seed's warm start, evaluated (no RL) |" in report
    for split in ("IID", "OOD"):
        rows = re.findall(r"\| ppo_epo - warm_start_only \| ([+-]\d\.\d{3}) \|.*\| \[[+-]\d\.\d{3}, [+-]\d\.\d{3}\] "
                          r"(paired|unpaired) \|", report.split(f"## {split}: paired")[1].split("\n## ")[0])
        assert len(rows) == 1 and rows[0][1] == "paired", report
        split_key = split.lower()
        trained = load_run(run_dir(out, "ppo_epo", 0)).history[f"val/{split_key}/success"][-1][1]
        evaluated = json.loads((run_dir(out, "warm_start_only", 0) / "eval.json").read_text())
        evaluated = evaluated[f"val/{split_key}/success"]
        assert float(rows[0][0]) == pytest.approx(trained - evaluated, abs=5e-4)
    assert "| 0 | warm_start_only | finished |" in status(Plan.read(plan_path), out)
    assert compare(plan_path, out).read_text() == report  # nothing runs again
    assert (out / "commands.txt").read_text().splitlines() == commands


def test_a_control_named_as_an_arm_is_refused(tiny_model_path, tmp_path):
    plan_path = write_plan(tmp_path / "plan.yaml", tiny_model_path, {"a": ["algo=ppo"]}, control="a")
    with pytest.raises(UserError, match="the control a is also an arm"):
        Plan.read(plan_path)


def test_seeds_limit_what_runs_and_is_reported_and_a_seed_the_plan_lacks_is_refused(tiny_model_path, tmp_path,
                                                                                     capsys):
    """``--seeds``: a pause after seed 0 that a plan's rule asks for (docs/comparison_sciworld.md)."""
    plan_path = write_plan(tmp_path / "plan.yaml", tiny_model_path, {"a": ["algo=ppo"], "b": ["algo=ppo_epo"]},
                           seeds=[0, 1, 2])
    out = tmp_path / "cmp"
    from lightning_epo.reports.compare import main

    main([str(plan_path), "--out", str(out), "--status", "--seeds", "2", "0"])
    printed = capsys.readouterr().out
    assert Plan.read(plan_path).with_seeds([2, 0]).seeds == [0, 2]  # in the plan's order
    assert printed == status(Plan.read(plan_path).with_seeds([2, 0]), out)  # the command line's --seeds reached it
    assert "| 1 |" not in printed and "| 0 |" in printed and "| 2 |" in printed
    assert printed.count("| not started |") == 4
    with pytest.raises(UserError, match=r"--seeds 5: not a seed of the plan plan \(its seeds: 0 1 2\)"):
        compare(plan_path, out, seeds=[0, 5])
    assert not (out / "commands.txt").exists()  # refused before anything ran
