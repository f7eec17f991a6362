"""How final evaluation episodes ended, per task: counts, Wilson shares, mean turns and returns, runs pooled by
label."""

from __future__ import annotations

import json

import pytest

from lightning_epo.reports import endings


def write(run_dir, rows, mode="train", after=6):
    run_dir.mkdir(parents=True, exist_ok=True)
    with (run_dir / "eval_episodes.jsonl").open("a") as f:
        for place, (split, task, won, truncated, turns, ret) in enumerate(rows):
            f.write(json.dumps({"mode": mode, "after_rl_steps": after, "split": split, "place": place, "task": task,
                                "won": won, "return": ret, "turns": turns, "truncated": truncated}) + "\n")


FIND = "find a(n) animal. First, focus on the thing. Then, move it to the {} box."


def test_each_episode_ends_won_failed_or_cut_under_its_tasks_first_sentence(tmp_path):
    write(tmp_path, [("iid", FIND.format("red"), True, False, 12, 19.2),
                     ("iid", FIND.format("blue"), False, False, 6, 1.0),
                     ("ood", FIND.format("green"), False, True, 16, 3.5),
                     ("ood", "turn on the motor.", False, True, 16, 1.0)])
    ended = endings.tally(endings.run_episodes(tmp_path, ("iid", "ood")))
    assert {name: len(rows) for name, rows in ended["find a(n) animal"].items()} == {"won": 1, "failed": 1, "cut": 1}
    assert {name: len(rows) for name, rows in ended[endings.ALL_TASKS].items()} == {"won": 1, "failed": 1, "cut": 2}
    assert [len(rows) for rows in ended["turn on the motor"].values()] == [0, 0, 1]
    table = endings.rows(ended)
    assert table[-1][0] == endings.ALL_TASKS  # the total after the tasks
    assert table[-1][1:5] == ["4", "1: 25.0 [4.6, 69.9]", "1: 25.0 [4.6, 69.9]", "2: 50.0 [15.0, 85.0]"]
    assert table[-1][5:] == ["12.0 / 6.0 / 16.0", "19.20 / 1.00 / 2.25"]


def test_a_recorded_task_name_groups_instead_of_the_text(tmp_path):
    write(tmp_path, [("iid", FIND.format("red"), True, False, 12, 19.2)])
    rows = [json.loads(line) | {"task_name": "find-animal"} for line in (tmp_path / "eval_episodes.jsonl").open()]
    (tmp_path / "eval_episodes.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert set(endings.tally(endings.run_episodes(tmp_path, ("iid",)))) == {"find-animal", endings.ALL_TASKS}


def test_the_last_training_evaluation_counts_and_a_control_reads_its_mode_eval_one(tmp_path):
    write(tmp_path / "arm", [("iid", "t.", True, False, 3, 1.0)], after=0)
    write(tmp_path / "arm", [("iid", "t.", False, True, 16, 0.0)], after=6)
    write(tmp_path / "arm", [("iid", "t.", True, False, 3, 1.0)], mode="eval")  # a later mode=eval of the same run
    write(tmp_path / "control", [("iid", "t.", True, False, 3, 1.0)], mode="eval", after=0)
    assert [ending["turns"] for ending in endings.run_episodes(tmp_path / "arm", ("iid",))] == [16]
    assert [ending["won"] for ending in endings.run_episodes(tmp_path / "control", ("iid",))] == [True]


def test_a_label_pools_its_runs_and_a_directory_without_episodes_is_one_error_line(tmp_path, capsys):
    for name, won in (("a", True), ("b", False)):
        write(tmp_path / name, [("iid", "t.", won, not won, 4, 1.0)])
    endings.main([f"rl={tmp_path / 'a'}", f"rl={tmp_path / 'b'}", "--split", "iid"])
    out = capsys.readouterr().out
    assert "rl: final evaluation, iid" in out and "| all tasks | 2 | 1: 50.0" in out
    with pytest.raises(SystemExit):
        endings.main([str(tmp_path / "missing")])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no iid evaluation episodes" in err[0] and "give run directories that evaluated" in err[0]
