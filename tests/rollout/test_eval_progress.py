"""EvalProgress: an evaluation's episodes finished, success so far, time left, and a log line at most every N s."""

from __future__ import annotations

import logging

import pytest

from lightning_epo.rollout.episode import Episode
from lightning_epo.rollout.eval_progress import EvalProgress


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def episodes(*won: bool) -> list[Episode]:
    return [Episode(traj_id=0, group_id=0, task="t", won=w) for w in won]


def test_counts_success_and_time_left_at_the_pace_so_far():
    clock = Clock()
    progress = EvalProgress("iid", total=10, rl_step=5, clock=clock)
    progress.turn_done([])
    assert progress.seconds_left() is None and progress.success == 0.0
    assert progress.line() == "evaluation at RL step 5, iid: 0/10 episodes after 1 turns"
    clock.now += 8.0
    progress.turn_done(episodes(True, True, False))
    progress.turn_done(episodes(True))
    assert (progress.turns, progress.done) == (3, 4) and progress.success == pytest.approx(0.75)
    assert progress.seconds_left() == pytest.approx(8.0 / 4 * 6)
    clock.now += 92.0  # 100 s for 4 episodes: 150 s for the 6 left
    assert progress.line() == ("evaluation at RL step 5, iid: 4/10 episodes after 3 turns, success 0.75, "
                               "about 2 min 30 s left")


def test_listeners_hear_of_each_turn_that_ended_episodes_and_the_log_line_comes_at_most_every_interval(caplog):
    clock, seen = Clock(), []
    progress = EvalProgress("ood", total=100, rl_step=0, listeners=[lambda p: seen.append(p.done)], log_every_s=30.0,
                            clock=clock)
    with caplog.at_level(logging.INFO, logger="lightning_epo.rollout.eval_progress"):
        for turn in range(10):
            clock.now += 10.0
            progress.turn_done(episodes(False) if turn % 2 else [])  # a turn that ends no episode logs too
    assert seen == [1, 2, 3, 4, 5]
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(": ")[1].split(",")[0] for line in lines] == [
        "1/100 episodes after 3 turns", "3/100 episodes after 6 turns", "4/100 episodes after 9 turns"]
