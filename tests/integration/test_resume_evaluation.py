"""An evaluation that the run did not finish is not lost: a run stopped inside one (a crash, a preemption, the end of
a session) plays it when resumed, with the values an uninterrupted run logs; and a stop (``stop_at_step``) evaluates
only where ``test_every`` asks for an evaluation."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest

from lightning_epo.core.errors import ConfigError
from lightning_epo.runtime.run import run
from tests.integration.test_exact_resume import COMPARED, FAST, assert_logged_alike, logged

EVERY_STEP = [o for o in FAST if not o.startswith(("total_steps=", "test_every="))] + [
    "test_every=2", "callbacks.checkpoint.every_n_rl_steps=1"]
CRASH = "tests.integration.test_resume_evaluation.CrashInEvaluation"


class CrashInEvaluation(L.Callback):
    """Raises as the evaluation after RL step ``at_step`` starts: the run dies after that step's checkpoint."""

    def __init__(self, at_step: int) -> None:
        self.at_step = at_step

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit" and pl_module.rl_step == self.at_step:
            raise RuntimeError(f"a crash in the evaluation after RL step {self.at_step}")


def evaluations(run_dir: Path) -> dict[int, dict[str, float]]:
    """The ``val/*`` values of a run, by logged step."""
    return {step: values for step, values in logged(run_dir, ("val/",)).items() if values}


@pytest.mark.parametrize("total_steps", [2, 4], ids=["the final evaluation", "an evaluation mid-run"])
def test_a_run_that_died_in_an_evaluation_plays_it_when_resumed(compose_cfg, tmp_path, total_steps):
    args = [*EVERY_STEP, f"total_steps={total_steps}"]
    run(compose_cfg(*args, f"run_dir={tmp_path / 'whole'}"))
    with pytest.raises(RuntimeError, match="a crash in the evaluation"):
        run(compose_cfg(*args, f"run_dir={tmp_path / 'split'}", f"+callbacks.crash._target_={CRASH}",
                        "+callbacks.crash.at_step=2"))
    run(compose_cfg(*args, "ckpt_path=last", f"run_dir={tmp_path / 'split'}"))

    whole, split = evaluations(tmp_path / "whole"), evaluations(tmp_path / "split")
    assert sorted(whole) == [1, 3][: total_steps // 2]  # after RL steps 2 and 4: Lightning's steps 1 and 3
    assert sorted(split) == sorted(whole)
    assert_logged_alike(whole, split)
    trained, resumed = logged(tmp_path / "whole", COMPARED), logged(tmp_path / "split", COMPARED)
    assert sorted(resumed) == sorted(trained) == list(range(total_steps))
    assert_logged_alike(trained, resumed)
    with pytest.raises(ConfigError, match=f"finished its {total_steps} RL steps"):  # the evaluation is on record
        run(compose_cfg(*args, "ckpt_path=last", f"run_dir={tmp_path / 'split'}"))


@pytest.mark.parametrize(("stop_at_step", "evaluated"), [(1, []), (2, [1])])
def test_a_stopped_run_evaluates_only_where_test_every_asks(compose_cfg, tmp_path, stop_at_step, evaluated):
    """Lightning validates when ``trainer.should_stop`` is set, whatever ``val_check_interval`` says: a run with
    ``stop_at_step=1`` and ``test_every=2`` used to play a whole evaluation before it stopped."""
    run(compose_cfg(*EVERY_STEP, "total_steps=4", f"stop_at_step={stop_at_step}", f"run_dir={tmp_path}"))
    assert sorted(evaluations(tmp_path)) == evaluated
