"""Exact resume: stop at step 3 and resume from last.ckpt, and steps 3-5 log what an uninterrupted run logs
(and the log still holds steps 0-2)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from lightning_epo.runtime.run import run

FAST = ["debug=fast", "logger=csv", "~callbacks.progress_bar", "test_every=1000", "total_steps=6",
        "data.episodes_per_step=2", "env.max_turns=2", "rollout.max_new_tokens=8"]
COMPARED = ("train/", "loss/", "epo/")  # perf/* are timings
# the mean |engine log-prob - trainer log-prob| of float32 runs is the two log-probs' rounding (about 5e-7 on log-probs
# of size 1-10): where that rounding moves, the value moves by as much, so it is compared to 2e-6 absolute
LOGPROB_ROUNDING = {"train/sampler_logprob_gap": 2e-6}


def logged(run_dir: Path, compared: tuple[str, ...] = COMPARED) -> dict[int, dict[str, float]]:
    """``metrics.csv`` of a run as ``{step: {metric: value}}``, the metrics whose names start with ``compared`` (the
    last row wins for a step logged twice: a resumed run appends to the file)."""
    rows: dict[int, dict[str, float]] = {}
    with open(run_dir / "csv" / "metrics.csv") as f:
        for row in csv.DictReader(f):
            step = int(row.pop("step"))
            values = {k: float(v) for k, v in row.items() if v != "" and k.startswith(compared)}
            rows.setdefault(step, {}).update(values)
    return rows


def assert_logged_alike(whole: dict[int, dict[str, float]], split: dict[int, dict[str, float]]) -> None:
    """Every step of ``whole`` (:func:`logged`) logged the same metrics in ``split``, with the same values.

    DESIGN's first promise (one command, one machine, one seed: the same values bit for bit, stopped and resumed or
    not), checked within rel 1e-6 (about 8 float32 ulp) or 1e-7 absolute (``LOGPROB_ROUNDING``: the log-prob gap's
    own size): the tests run ``whole`` in the test process, after other tests whose state there moved its float
    rounding against a ``train.py`` subprocess on an AVX-512 CPU with AMX (in the full suite: 4.8e-7 on a loss of
    6.7, 7.5e-9 against -7.5e-9 on a policy loss near 0). Two commands are compared bit for bit in docs/history.md
    ("Bit-identical runs on AVX-512 CPUs"), and tests/models/test_shared_prefix.py holds the gradient that used to
    part them."""
    for step, values in whole.items():
        assert split[step].keys() == values.keys(), step
        for name, value in values.items():
            tolerance = LOGPROB_ROUNDING.get(name, 1e-7)
            assert split[step][name] == pytest.approx(value, rel=1e-6, abs=tolerance), (step, name)


def test_stop_and_resume_logs_the_same_values_as_one_run(compose_cfg, tmp_path):
    run(compose_cfg(*FAST, f"run_dir={tmp_path / 'whole'}"))
    run(compose_cfg(*FAST, "stop_at_step=3", f"run_dir={tmp_path / 'split'}"))
    run(compose_cfg(*FAST, "ckpt_path=last", f"run_dir={tmp_path / 'split'}"))

    whole, resumed = logged(tmp_path / "whole"), logged(tmp_path / "split")
    assert set(range(6)) <= resumed.keys()  # Lightning's own CSVLogger deleted steps 0-2 on resume
    for step in range(6):
        assert {"train/reward", "loss/total"} <= whole[step].keys() and (step == 0 or "epo/entropy_ref" in whole[step])
    assert_logged_alike({step: whole[step] for step in range(6)}, resumed)


# schedules that do not depend on K: a constant lr (no warmup, minimum ratio 1) and no β_k (PPO without EPO)
UNSCHEDULED = ["algo=ppo", "optim.warmup_ratio=0", "optim.min_lr_ratio=1.0"]


def test_a_finished_run_resumed_with_more_steps_trains_exactly_those_steps(compose_cfg, tmp_path, caplog):
    """``ckpt_path=last total_steps=K+2`` on a finished K-step run trains steps K and K+1 (it used to exit 0 having
    trained nothing), and with schedules that do not depend on K logs what an uninterrupted K+2 run logs."""
    import logging

    base = [o for o in FAST if not o.startswith("total_steps")] + UNSCHEDULED
    run(compose_cfg(*base, "total_steps=6", f"run_dir={tmp_path / 'whole'}"))
    run(compose_cfg(*base, "total_steps=4", f"run_dir={tmp_path / 'extended'}"))
    with caplog.at_level(logging.WARNING):
        run(compose_cfg(*base, "total_steps=6", "ckpt_path=last", f"run_dir={tmp_path / 'extended'}"))

    whole, extended = logged(tmp_path / "whole"), logged(tmp_path / "extended")
    assert sorted(extended) == list(range(6))
    assert_logged_alike({step: whole[step] for step in (4, 5)}, extended)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("extending the finished 4-step run to total_steps=6" in w for w in warnings), warnings


def test_a_finished_run_resumed_without_more_steps_says_it_is_finished(compose_cfg, tmp_path):
    from lightning_epo.core.errors import ConfigError

    run(compose_cfg(*FAST, "total_steps=2", f"run_dir={tmp_path / 'run'}"))
    with pytest.raises(ConfigError, match=r"finished its 2 RL steps: .*total_steps above 2 to extend it"):
        run(compose_cfg(*FAST, "total_steps=2", "ckpt_path=last", f"run_dir={tmp_path / 'run'}"))
