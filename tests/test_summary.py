"""Succ.* / Succ. and the entropy oscillation columns from hand-made run directories, numbers worked out by hand."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from lightning_epo.core.errors import UserError
from lightning_epo.reports.run_history import load_run
from lightning_epo.reports.summary import main, summarize

VAL_STEPS = [4, 9, 14, 19]
ENTROPY = ["loss/entropy", "entropy/early_turns"]


def make_run(root: Path, name: str, algo: str, seed: int, success: list[float],
             entropy: dict[str, list[float]] | None = None) -> Path:
    """A run directory as train.py leaves it with logger=csv: Hydra's saved config (unresolved
    interpolations included) and Lightning's CSV, where train and validation rows alternate.
    ``entropy`` maps a metric to its values at RL steps 0, 1, ..., logged in the train rows."""
    entropy = entropy or {}
    run_dir = root / name
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text(
        f"seed: {seed}\nrun_name: ${{env.name}}-${{algo.name}}-s${{seed}}\nenv:\n  name: gridworld\nalgo:\n  name: {algo}\n"
    )
    (run_dir / "csv").mkdir()
    with open(run_dir / "csv" / "metrics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, ["epoch", "step", "train/reward", "val/iid/success", *ENTROPY])
        writer.writeheader()
        for step in range(VAL_STEPS[-1] + 1):
            logged = {k: v[step] for k, v in entropy.items() if step < len(v)}
            writer.writerow({"epoch": 0, "step": step, "train/reward": 0.1 * step, **logged})
            if step in VAL_STEPS:
                writer.writerow({"epoch": 0, "step": step, "val/iid/success": success[VAL_STEPS.index(step)]})
    return run_dir


@pytest.fixture
def runs(tmp_path):
    return [
        # best 0.6, last two 0.45; entropy steps 0, 0.3, 0.6: std 0.3; early turns: 2 points (n/a)
        make_run(tmp_path, "ppo_s0", "ppo", 0, [0.2, 0.6, 0.4, 0.5],
                 {"loss/entropy": [1.0, 1.0, 1.3, 1.9], "entropy/early_turns": [2.0, 2.0]}),
        # best 0.9, last two 0.9; constant entropy: std 0; no early-turn entropy logged
        make_run(tmp_path, "epo_s0", "ppo_epo", 0, [0.5, 0.8, 0.9, 0.9], {"loss/entropy": [1.0, 1.0, 1.0]}),
        # best 0.7, last two 0.5; entropy steps -0.1, 0.1, 0.3: std 0.2, early turns the same
        make_run(tmp_path, "ppo_s1", "ppo", 1, [0.1, 0.3, 0.7, 0.3],
                 {"loss/entropy": [1.0, 0.9, 1.0, 1.3], "entropy/early_turns": [2.0, 1.9, 2.0, 2.3]}),
    ]


def test_succ_star_is_best_and_succ_is_last_window_mean_averaged_over_seeds(runs):
    ppo, epo = summarize([load_run(d) for d in runs], "val/iid/success", window=2)
    assert (ppo.label, ppo.seeds, epo.label, epo.seeds) == ("ppo", [0, 1], "ppo_epo", [0])
    assert ppo.succ_star == pytest.approx((0.6 + 0.7) / 2)
    assert ppo.succ == pytest.approx((0.45 + 0.5) / 2)
    assert ppo.succ_star_std == pytest.approx(0.0707107, abs=1e-6)  # sample std of (0.6, 0.7)
    assert (epo.succ_star, epo.succ) == pytest.approx((0.9, 0.9))


def test_window_longer_than_the_run_uses_every_evaluation(runs):
    (ppo,) = summarize([load_run(runs[0])], window=50)
    assert ppo.succ == pytest.approx((0.2 + 0.6 + 0.4 + 0.5) / 4)


def test_cli_prints_percent_and_writes_markdown(runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # a terminal wide enough that rich keeps each cell on one line
    md = tmp_path / "table.md"
    main([str(d) for d in runs] + ["--window", "2", "--markdown", str(md)])
    printed = capsys.readouterr().out
    assert "65.0 ± 7.1" in printed and "47.5 ± 3.5" in printed
    assert "| ppo_epo | 1 | 0 | 90.0 | 90.0 | 0.0000 | n/a | n/a |" in md.read_text()


def test_missing_metric_is_one_error_line(runs, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([str(runs[0]), "--metric", "val/heldout/success"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "val/iid/success" in err and err.count("\n") == 1


def test_label_groups_runs_of_one_algo_apart(runs, tmp_path, capsys):
    """``LABEL=DIR``: two ppo runs under different labels are two rows, not one group of two seeds."""
    md = tmp_path / "table.md"
    main([f"control={runs[0]}", str(runs[2]), "--window", "2", "--markdown", str(md)])
    table = md.read_text()
    assert "| control | 1 | 0 | 60.0 | 45.0 |" in table and "| ppo | 1 | 1 | 70.0 | 50.0 |" in table


def test_from_step_leaves_out_earlier_evaluations(runs):
    (ppo,) = summarize([load_run(runs[0])], window=50, from_step=5)  # drops the step-4 evaluation (0.2)
    assert (ppo.succ_star, ppo.succ) == pytest.approx((0.6, (0.6 + 0.4 + 0.5) / 3))


def test_from_step_beyond_every_evaluation_is_one_line(runs):
    with pytest.raises(UserError, match="has no 'val/iid/success' points at step >= 20"):
        summarize([load_run(runs[0])], from_step=20)


def test_cli_from_step_is_applied_and_named_in_the_table(runs, tmp_path):
    md = tmp_path / "table.md"
    main([str(runs[0]), "--window", "50", "--from-step", "5", "--markdown", str(md)])
    table = md.read_text()
    assert "(evaluations at step >= 5)" in table and "| ppo | 1 | 0 | 60.0 | 50.0 |" in table


def test_oscillation_is_std_of_step_changes_per_run_over_runs_with_three_points(runs):
    ppo, epo = summarize([load_run(d) for d in runs], window=2)
    assert ppo.oscillation["loss/entropy"] == pytest.approx([0.3, 0.2])
    assert ppo.oscillation["entropy/early_turns"] == pytest.approx([0.2])  # seed 0 has 2 points only
    assert epo.oscillation == {"loss/entropy": [0.0], "entropy/early_turns": []}


def test_cli_prints_oscillation_mean_and_std_over_seeds_in_both_tables(runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # a terminal wide enough that rich keeps each cell on one line
    md = tmp_path / "table.md"
    main([str(d) for d in runs] + ["--window", "2", "--markdown", str(md)])
    printed, table = capsys.readouterr().out, md.read_text()
    # ppo: mean of (0.3, 0.2) and their sample std 0.0707; early turns from seed 1 alone
    assert "0.2500 ± 0.0707" in printed and "0.2000 (1 of 2 runs)" in printed
    assert "| ppo | 2 | 0, 1 | 65.0 ± 7.1 | 47.5 ± 3.5 | 0.2500 ± 0.0707 | 0.2000 (1 of 2 runs) | n/a |" in table
    assert "| ppo_epo | 1 | 0 | 90.0 | 90.0 | 0.0000 | n/a | n/a |" in table
    assert "ΔH osc." in printed and "std over RL steps of H_k - H_{k-1}" in table


def test_oscillation_without_entropy_metrics_is_n_a(tmp_path):
    md = tmp_path / "table.md"
    main([str(make_run(tmp_path, "ppo_s0", "ppo", 0, [0.2, 0.6, 0.4, 0.5])), "--markdown", str(md)])
    assert "| ppo | 1 | 0 | 60.0 | 42.5 | n/a | n/a | n/a |" in md.read_text()


def test_eval_column_is_each_final_evaluation_averaged_over_the_runs_that_have_one(runs, tmp_path):
    """``eval.json`` (``mode=eval``'s file) gives the Eval. column; a run without one, or whose file lacks the metric,
    is counted out and named, and the logged history's columns do not change."""
    (runs[0] / "eval.json").write_text(json.dumps({"val/iid/success": 0.62, "val/ood/success": 0.3}))
    (runs[1] / "eval.json").write_text(json.dumps({"val/ood/success": 0.4}))
    (runs[2] / "eval.json").write_text(json.dumps({"val/iid/success": 0.68}))
    ppo, epo = summarize([load_run(d) for d in runs], window=2)
    assert ppo.evaluated == pytest.approx([0.62, 0.68]) and epo.evaluated == []
    md = tmp_path / "table.md"
    main([str(d) for d in runs] + ["--window", "2", "--markdown", str(md)])
    table = md.read_text()
    assert "| ppo | 2 | 0, 1 | 65.0 ± 7.1 | 47.5 ± 3.5 | 0.2500 ± 0.0707 | 0.2000 (1 of 2 runs) | 65.0 ± 4.2 |" in table
    assert "| ppo_epo | 1 | 0 | 90.0 | 90.0 | 0.0000 | n/a | n/a |" in table
    (runs[2] / "eval.json").unlink()
    main([str(d) for d in runs] + ["--window", "2", "--markdown", str(md)])
    assert "| 0.2000 (1 of 2 runs) | 62.0 (1 of 2 runs) |" in md.read_text()


def test_damaged_eval_json_is_one_error_line(runs, capsys):
    (runs[0] / "eval.json").write_text('{"val/iid/success": 0.6')  # cut short
    with pytest.raises(SystemExit) as exit_info:
        main([str(runs[0])])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("error: ") and "eval.json is not JSON" in err
    assert err.count("\n") == 1
