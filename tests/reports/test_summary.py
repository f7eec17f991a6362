"""Succ.* / Succ., the success columns with their 95 % Wilson interval and n, and the entropy oscillation columns from
hand-made run directories, numbers worked out by hand."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from lightning_epo.core.errors import UserError
from lightning_epo.reports.run_history import load_run
from lightning_epo.reports.summary import Evaluation, main, summarize
from lightning_epo.reports.wilson import format_rate, newcombe_interval, wilson_interval
from lightning_epo.reports.wilson import main as wilson_main

VAL_STEPS = [4, 9, 14, 19]
ENTROPY = ["loss/entropy", "entropy/early_turns"]


def make_run(root: Path, name: str, algo: str, seed: int, success: list[float],
             entropy: dict[str, list[float]] | None = None, episodes: int | None = 10, val_size: str = "null") -> Path:
    """A run directory as train.py leaves it with logger=csv: Hydra's saved config (unresolved
    interpolations included) and Lightning's CSV, where train and validation rows alternate.
    ``entropy`` maps a metric to its values at RL steps 0, 1, ..., logged in the train rows; ``episodes`` is the
    logged ``val/iid/episodes`` of every evaluation (None: a run from before that metric)."""
    entropy = entropy or {}
    run_dir = root / name
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text(
        f"seed: {seed}\nrun_name: ${{env.name}}-${{algo.name}}-s${{seed}}\nmode: train\n"
        f"env:\n  name: gridworld\n  val_size: {val_size}\nalgo:\n  name: {algo}\n"
    )
    (run_dir / "csv").mkdir()
    with open(run_dir / "csv" / "metrics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, ["epoch", "step", "train/reward", "val/iid/success", "val/iid/episodes", *ENTROPY])
        writer.writeheader()
        for step in range(VAL_STEPS[-1] + 1):
            logged = {k: v[step] for k, v in entropy.items() if step < len(v)}
            writer.writerow({"epoch": 0, "step": step, "train/reward": 0.1 * step, **logged})
            if step in VAL_STEPS:
                writer.writerow({"epoch": 0, "step": step, "val/iid/success": success[VAL_STEPS.index(step)],
                                 "val/iid/episodes": episodes})
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
    assert "40.0 [21.9, 61.3], n=20" in printed  # Final: the seeds' last evaluations pooled, 8 of 20 episodes
    assert "| ppo_epo | 1 | 0 | 90.0 | 90.0 | 90.0 [59.6, 98.2], n=10 | 0.0000 | n/a | n/a |" in md.read_text()


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
    assert ("| ppo | 2 | 0, 1 | 65.0 ± 7.1 | 47.5 ± 3.5 | 40.0 [21.9, 61.3], n=20 | 0.2500 ± 0.0707 "
            "| 0.2000 (1 of 2 runs) | n/a |") in table
    assert "| ppo_epo | 1 | 0 | 90.0 | 90.0 | 90.0 [59.6, 98.2], n=10 | 0.0000 | n/a | n/a |" in table
    assert "ΔH osc." in printed and "std over RL steps of H_k - H_{k-1}" in table


def test_oscillation_without_entropy_metrics_is_n_a(tmp_path):
    md = tmp_path / "table.md"
    main([str(make_run(tmp_path, "ppo_s0", "ppo", 0, [0.2, 0.6, 0.4, 0.5])), "--markdown", str(md)])
    assert "| ppo | 1 | 0 | 60.0 | 42.5 | 50.0 [23.7, 76.3], n=10 | n/a | n/a | n/a |" in md.read_text()


def test_eval_column_is_each_final_evaluation_pooled_over_the_runs_that_have_one(runs, tmp_path):
    """``eval.json`` (``mode=eval``'s file) gives the Eval. column, its episodes pooled over runs; a run without one, or
    whose file lacks the metric, is counted out and named, and the logged history's columns do not change."""
    (runs[0] / "eval.json").write_text(json.dumps({"val/iid/success": 0.62, "val/iid/episodes": 100.0,
                                                   "val/ood/success": 0.3}))
    (runs[1] / "eval.json").write_text(json.dumps({"val/ood/success": 0.4}))
    (runs[2] / "eval.json").write_text(json.dumps({"val/iid/success": 0.68, "val/iid/episodes": 100.0}))
    ppo, epo = summarize([load_run(d) for d in runs], window=2)
    assert ppo.evaluated == [Evaluation(0.62, 100), Evaluation(0.68, 100)] and epo.evaluated == []
    md = tmp_path / "table.md"
    main([str(d) for d in runs] + ["--window", "2", "--markdown", str(md)])
    table = md.read_text()
    assert ("| ppo | 2 | 0, 1 | 65.0 ± 7.1 | 47.5 ± 3.5 | 40.0 [21.9, 61.3], n=20 | 0.2500 ± 0.0707 "
            "| 0.2000 (1 of 2 runs) | 65.0 [58.2, 71.3], n=200 |") in table  # 62 + 68 of 200
    assert "| ppo_epo | 1 | 0 | 90.0 | 90.0 | 90.0 [59.6, 98.2], n=10 | 0.0000 | n/a | n/a |" in table
    (runs[2] / "eval.json").unlink()
    main([str(d) for d in runs] + ["--window", "2", "--markdown", str(md)])
    assert "| 0.2000 (1 of 2 runs) | 62.0 [52.2, 70.9], n=100 (1 of 2 runs) |" in md.read_text()


def test_damaged_eval_json_is_one_error_line(runs, capsys):
    (runs[0] / "eval.json").write_text('{"val/iid/success": 0.6')  # cut short
    with pytest.raises(SystemExit) as exit_info:
        main([str(runs[0])])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("error: ") and "eval.json is not JSON" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize(("successes", "n", "low", "high"), [
    # scipy.stats.binomtest(successes, n).proportion_ci(0.95, method="wilson"), the same as statsmodels'
    # proportion_confint(successes, n, method="wilson")
    (8, 16, 0.279996, 0.720004), (0, 16, 0.0, 0.193608), (16, 16, 0.806392, 1.0), (3, 16, 0.065916, 0.430089),
    (62, 100, 0.522098, 0.709024), (81, 300, 0.222904, 0.322912),
])
def test_wilson_interval_matches_reference_values(successes, n, low, high):
    assert wilson_interval(successes, n) == pytest.approx((low, high), abs=1e-6)


def test_wilson_interval_needs_a_proportion():
    for successes, n in [(17, 16), (-1, 16), (0, 0)]:
        with pytest.raises(ValueError, match="0 <= successes <= n"):
            wilson_interval(successes, n)


@pytest.mark.parametrize(("counts", "low", "high"), [
    # Newcombe (1998), Table II, method 10
    ((56, 70, 48, 80), 0.0524, 0.3339), ((9, 10, 3, 10), 0.1705, 0.8090), ((6, 7, 2, 7), 0.0582, 0.8062),
    ((5, 56, 0, 29), -0.0381, 0.1926),
])
def test_newcombe_interval_of_a_difference_matches_the_papers_values(counts, low, high):
    assert newcombe_interval(*counts) == pytest.approx((low, high), abs=5e-5)


def test_wilson_command_prints_a_difference_of_two_rates(capsys):
    wilson_main(["56", "70", "48", "80"])
    assert capsys.readouterr().out == "+0.200 [+0.052, +0.334]\n"
    with pytest.raises(SystemExit):
        wilson_main(["56", "70", "48"])


def test_format_rate_is_percent_interval_and_n():
    assert format_rate(8, 16) == "50.0 [28.0, 72.0], n=16"


def test_final_column_is_each_runs_last_evaluation_pooled_over_its_runs(runs, tmp_path):
    """The last evaluations of ppo's two seeds, 5 and 3 of 10 episodes, pool to 8 of 20: the interval is over the 20
    episodes, and the caption says that a row of several runs pools them."""
    ppo, epo = summarize([load_run(d) for d in runs], window=2)
    assert ppo.last == [Evaluation(0.5, 10), Evaluation(0.3, 10)] and epo.last == [Evaluation(0.9, 10)]
    md = tmp_path / "table.md"
    main([str(d) for d in runs] + ["--window", "2", "--markdown", str(md)])
    table = md.read_text()
    assert "| Final (%) |" in table and "| 40.0 [21.9, 61.3], n=20 |" in table
    assert "95 % Wilson interval over n episodes, pooled over the row's runs when it has several" in table


def test_episodes_from_the_config_of_the_command_that_evaluated(tmp_path):
    """A run without ``val/<split>/episodes`` takes n from ``env.val_size`` of its saved config when that config is the
    training's (the logged history) or the evaluation's (eval.json); an unset val_size (every task) is n unknown."""
    run_dir = make_run(tmp_path, "old", "ppo", 0, [0.2, 0.6, 0.4, 0.5], episodes=None, val_size="10")
    (run_dir / "eval.json").write_text(json.dumps({"val/iid/success": 0.62}))
    (ppo,) = summarize([load_run(run_dir)])
    assert ppo.last == [Evaluation(0.5, 10)] and ppo.evaluated == [Evaluation(0.62, None)]
    config = run_dir / ".hydra" / "config.yaml"
    config.write_text(config.read_text().replace("mode: train", "mode: eval").replace("val_size: 10", "val_size: 50"))
    (ppo,) = summarize([load_run(run_dir)])
    assert ppo.last == [Evaluation(0.5, None)] and ppo.evaluated == [Evaluation(0.62, 50)]
    md = tmp_path / "table.md"
    main([str(run_dir), "--markdown", str(md)])
    assert "| 50.0 (n unknown) | n/a | n/a | 62.0 [48.2, 74.1], n=50 |" in md.read_text()
    unset = make_run(tmp_path, "all_tasks", "ppo", 0, [0.2, 0.6, 0.4, 0.5], episodes=None)
    assert summarize([load_run(unset)])[0].last == [Evaluation(0.5, None)]


def test_a_metric_that_is_not_a_success_rate_is_one_error_line(runs, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([str(runs[0]), "--metric", "val/iid/reward"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "val/<split>/success" in err and err.count("\n") == 1
