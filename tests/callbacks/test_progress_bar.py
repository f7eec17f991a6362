"""The progress bar shows an evaluation's episodes as they finish (one split is one batch to Lightning)."""

from __future__ import annotations

import importlib

from lightning_epo.callbacks.progress_bar import RLProgressBar
from lightning_epo.rollout.eval_progress import EvalProgress
from lightning_epo.runtime.run import run
from tests.integration.test_exact_resume import FAST

SHOWN: list[tuple[str, float, float | None, bool]] = []  # of the module Hydra imports (pytest may import another)


class RecordingBar(RLProgressBar):
    """Records the bar's episodes task after every update: (description, completed, total, visible)."""

    def show_episodes(self, progress: EvalProgress) -> None:
        super().show_episodes(progress)
        task = self.progress.tasks[self._episodes_task]
        SHOWN.append((task.description, task.completed, task.total, task.visible))


def test_each_split_shows_its_episodes_finished_of_its_total(compose_cfg, tmp_path):
    recorded = importlib.import_module("tests.callbacks.test_progress_bar").SHOWN  # the one Hydra fills
    recorded.clear()
    args = [o for o in FAST if o != "~callbacks.progress_bar"]
    run(compose_cfg(*args, "total_steps=1", "val_at_start=true", "env.val_size=6",
                    "callbacks.progress_bar._target_=tests.callbacks.test_progress_bar.RecordingBar"))
    for split in ("iid", "ood"):  # the random model plays every episode to the turn limit: all 6 end together
        shown = [(done, total) for description, done, total, visible in recorded
                 if description.startswith(f"{split} episodes, success ") and visible]
        assert shown and set(shown) == {(6, 6)}, recorded
