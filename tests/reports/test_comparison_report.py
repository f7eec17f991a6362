"""The comparison report's paired analysis on planted run directories (no training): episodes paired per task, a
planted difference found and a planted null not, runs that played other tasks refused, one seed (a pilot) without an
interval over seeds."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from lightning_epo.core.errors import UserError
from lightning_epo.reports.comparison.plan import Plan, run_dir
from lightning_epo.reports.comparison.report import report
from lightning_epo.reports.paired import NO_SPREAD

TASKS = 20


def plant_run(out, arm, seed, wins, tasks=None):
    """A finished run's directory as the report reads it: its config, a csv history with the final evaluation of
    both splits (``wins[split]``: which of the TASKS episodes won) and those episodes in eval_episodes.jsonl."""
    directory = run_dir(out, arm, seed)
    (directory / ".hydra").mkdir(parents=True)
    (directory / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"algo": {"name": arm}, "env": {"name": "grid"},
                                                                      "seed": seed}))
    header = ["step", "train/success", "entropy/early_turns"] + [f"val/{s}/{m}" for s in ("iid", "ood")
                                                                  for m in ("success", "episodes")]
    rows = [[0, 0.5, 0.1, "", "", "", ""],
            [1, 0.6, 0.2, *(x for s in ("iid", "ood") for x in (sum(wins[s]) / TASKS, TASKS))]]
    (directory / "csv").mkdir()
    (directory / "csv" / "metrics.csv").write_text("\n".join(",".join(map(str, r)) for r in [header, *rows]) + "\n")
    lines = [{"mode": "train", "after_rl_steps": 2, "split": s, "place": i, "task": (tasks or {}).get(i, f"t{i}"),
              "won": bool(w), "return": 10.0 * w, "turns": 3, "truncated": False}
             for s in ("iid", "ood") for i, w in enumerate(wins[s])]
    (directory / "eval_episodes.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def plan_of(tmp_path, seeds, arms=("base", "arm")):
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump({"experiment": "e", "seeds": seeds, "arms": {a: [f"x={a}"] for a in arms}},
                                   sort_keys=False))
    return Plan.read(path)


def wins_of(count):
    return [1] * count + [0] * (TASKS - count)


def rows(text, split):
    section = text.split(f"## {split.upper()}: paired differences")[1].split("\n## ")[0]
    return [line for line in section.splitlines() if line.startswith("| arm - base |")]


def test_a_planted_difference_is_found_and_a_planted_null_is_not(tmp_path):
    out = tmp_path / "cmp"
    plan = plan_of(tmp_path, [0, 1, 2, 3])
    for seed, base in enumerate((8, 10, 6, 12)):  # IID: the arm wins 6-8 more of 20 at every seed; OOD: the same
        plant_run(out, "base", seed, {"iid": wins_of(base), "ood": wins_of(base)})
        plant_run(out, "arm", seed, {"iid": wins_of(base + 6 + seed % 2 * 2), "ood": wins_of(base)})
    text = report(plan, out)
    assert "95 % Wilson interval: evaluation noise only" in text
    (iid,) = rows(text, "iid")
    cells = [c.strip() for c in iid.strip("|").split("|")]
    assert cells[1:6] == ["+0.300", "+0.400", "+0.300", "+0.400", "+0.350"]
    low, high = map(float, re.findall(r"[+-]\d\.\d{3}", cells[6]))
    assert 0 < low < 0.35 < high  # found: the t-interval over the 4 seeds excludes 0
    assert cells[8].endswith("paired") and not cells[8].endswith("unpaired")
    (ood,) = rows(text, "ood")
    # not found; the same difference at every seed has no spread, so neither an interval nor a detectable difference
    assert f"| +0.000 | +0.000 | +0.000 | +0.000 | +0.000 | {NO_SPREAD} | {NO_SPREAD} |" in ood


def test_runs_of_a_seed_that_played_other_tasks_are_refused(tmp_path):
    out = tmp_path / "cmp"
    plan = plan_of(tmp_path, [0, 1])
    for seed in (0, 1):
        plant_run(out, "base", seed, {"iid": wins_of(5), "ood": wins_of(5)})
        plant_run(out, "arm", seed, {"iid": wins_of(5), "ood": wins_of(5)}, tasks={3: "another task"} if seed else None)
    with pytest.raises(UserError, match=r"arm - base, seed 1, iid: the two runs' final evaluations did not play the "
                                        r"same tasks \(places \[3\] differ\)"):
        report(plan, out)


def test_a_pilot_of_one_seed_has_its_differences_and_no_interval_over_seeds(tmp_path):
    out = tmp_path / "cmp"
    plan = plan_of(tmp_path, [9], arms=("base", "arm", "other"))
    plant_run(out, "base", 9, {"iid": wins_of(10), "ood": wins_of(4)})
    plant_run(out, "arm", 9, {"iid": wins_of(7), "ood": wins_of(4)})
    plant_run(out, "other", 9, {"iid": wins_of(12), "ood": wins_of(5)})
    (iid,) = rows(report(plan, out), "iid")
    assert iid.startswith("| arm - base | -0.150 | -0.150 | n/a (one seed) | n/a (one seed) | [")


def test_a_control_and_the_scores_are_reported_against_it(tmp_path):
    """The control (``mode=eval``: eval.json and episodes of mode eval) as the baseline: success paired per task,
    and ScienceWorld's score, per seed the difference of the final mean scores, over seeds the t-interval."""
    out = tmp_path / "cmp"
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump({"experiment": "e", "seeds": [0, 1, 2], "control": "control",
                                    "arms": {"arm": ["x=arm"]}}, sort_keys=False))
    plan = Plan.read(path)
    for seed, (base, score) in enumerate(((8, 30.0), (10, 35.0), (6, 20.0))):
        plant_run(out, "arm", seed, {"iid": wins_of(base + 3), "ood": wins_of(base)})
        metrics = out / "arm" / f"s{seed}" / "csv" / "metrics.csv"
        header, first, last = metrics.read_text().splitlines()
        metrics.write_text(f"{header},val/iid/score\n{first},\n{last},{score + 10 + seed}\n")
        directory = run_dir(out, "control", seed)
        directory.mkdir(parents=True)
        (directory / "eval.json").write_text(json.dumps(
            {f"val/{s}/{m}": v for s in ("iid", "ood") for m, v in
             (("success", base / TASKS), ("episodes", TASKS), ("score", score))}))
        (directory / "eval_episodes.jsonl").write_text("".join(
            json.dumps({"mode": "eval", "after_rl_steps": 0, "split": s, "place": i, "task": f"t{i}", "won": bool(w),
                        "return": 10.0 * w, "turns": 3, "truncated": False}) + "\n"
            for s in ("iid", "ood") for i, w in enumerate(wins_of(base))))
    text = report(plan, out)
    assert "Baseline: control." in text
    iid = [line for line in text.split("## IID: paired")[1].split("\n## ")[0].splitlines()
           if line.startswith("| arm - control |")]
    assert len(iid) == 1 and iid[0].startswith("| arm - control | +0.150 | +0.150 | +0.150 | +0.150 |")
    assert iid[0].endswith("paired |")
    scores = text.split("## Final score")[1].split("### IID: final score")[1].split("###")[0]
    assert "| control | 30 | 35 | 20 |" in scores and "| arm | 40 | 46 | 32 |" in scores
    assert "| arm - control | +10 | +11 | +12 | +11 |" in scores
    assert "### OOD: final score" in text and "| arm | - | - | - |" in text.split("### OOD: final score")[1]


def test_episodes_ended_by_a_failure_are_counted_per_arm_and_paired_over_seeds(tmp_path):
    """ScienceWorld's fail-fast measure: the share of the final evaluation's episodes that ended neither won nor cut at
    the turn limit, and of those within 2 turns, and where the others went: the share cut at the turn limit without a
    win; for a split where no recorded episode failed, one line that says so."""
    out = tmp_path / "cmp"
    plan = plan_of(tmp_path, [0, 1])
    for seed in (0, 1):
        for arm, failed in (("base", {}), ("arm", {5: 1, 6: 2, 7: 9 + seed})):  # IID places that failed: their turns
            plant_run(out, arm, seed, {"iid": wins_of(5), "ood": wins_of(5)})
            path = run_dir(out, arm, seed) / "eval_episodes.jsonl"
            episodes = [json.loads(line) for line in path.read_text().splitlines()]
            for episode in episodes:
                fails = episode["split"] == "iid" and episode["place"] in failed
                episode["truncated"] = not episode["won"] and not fails
                episode["turns"] = failed[episode["place"]] if fails else 3 if episode["won"] else 16
            path.write_text("".join(json.dumps(episode) + "\n" for episode in episodes))
    text = report(plan, out)
    ended = text.split("### IID: final evaluation's episodes ended by a failure (")[1].split("###")[0]
    assert "| base | 0 | 0 |" in ended and "| arm | 0.15 | 0.15 |" in ended
    assert "| arm - base | +0.15 | +0.15 | +0.15 |" in ended
    fast = text.split("### IID: final evaluation's episodes ended by a failure within 2 turns")[1].split("###")[0]
    assert "| arm | 0.1 | 0.1 |" in fast and "| arm - base | +0.1 | +0.1 | +0.1 |" in fast
    cut = text.split("### IID: final evaluation's episodes cut at the turn limit without a win")[1].split("###")[0]
    assert "| base | 0.75 | 0.75 |" in cut and "| arm | 0.6 | 0.6 |" in cut
    assert "| arm - base | -0.15 | -0.15 | -0.15 |" in cut
    assert "### OOD: final evaluation's episodes ended by a failure" not in text
    section = text.split("## Episodes ended by a failure")[1].split("\n## ")[0]
    assert "OOD: none of the final evaluation's 80 recorded episodes (2 arms x 2 seeds) ended by a failure" in section
    assert "IID: none" not in section
