"""An evaluation's progress while its episodes play: episodes finished of the split's total, success so far and an
estimate of the time left, for the progress bar (lightning_epo/callbacks/progress_bar.py) and, at most every
``log_every_s`` seconds, a log line (a run without a terminal, and train.log, see it move too)."""

from __future__ import annotations

import logging
import time
from typing import Callable

from lightning_epo.rollout.episode import Episode

log = logging.getLogger(__name__)


class EvalProgress:
    """Counts the turns and the finished episodes of one split's evaluation on this rank (``total``: the rank's
    share), fed by the collector after every turn (``EpisodeCollector.collect``'s ``on_turn``).

    ``listeners`` are called with this object after every turn that ended episodes; ``clock`` is ``time.monotonic``
    but in tests."""

    def __init__(
        self,
        split: str,
        total: int,
        rl_step: int,
        listeners: list[Callable[[EvalProgress], None]] | None = None,
        log_every_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.split, self.total, self.rl_step = split, total, rl_step
        self.listeners = list(listeners or [])
        self.log_every_s, self.clock = log_every_s, clock
        self.turns = self.done = self.wins = 0
        self.started = self._logged = clock()

    @property
    def success(self) -> float:
        """The share of the finished episodes that were won (0 before the first ends)."""
        return self.wins / self.done if self.done else 0.0

    def seconds_left(self) -> float | None:
        """The time left at the pace so far; None before the first episode ends. Episodes end in waves (the pool's
        slots refill), so it is rough until several waves have ended."""
        if not self.done:
            return None
        return (self.clock() - self.started) / self.done * (self.total - self.done)

    def line(self) -> str:
        """``evaluation at RL step 10, iid: 40/100 episodes after 57 turns, success 0.78, about 1 min 20 s left``."""
        left = self.seconds_left()
        outcome = "" if left is None else f", success {self.success:.2f}, about {_duration(left)} left"
        return (f"evaluation at RL step {self.rl_step}, {self.split}: {self.done}/{self.total} episodes after "
                f"{self.turns} turns{outcome}")

    def turn_done(self, ended: list[Episode]) -> None:
        """Count a turn and the episodes that ended in it; tell the listeners where some did; log :meth:`line` where
        ``log_every_s`` has passed since the last (or since the start)."""
        self.turns += 1
        self.done += len(ended)
        self.wins += sum(bool(episode.won) for episode in ended)
        if ended:
            for listener in self.listeners:
                listener(self)
        now = self.clock()
        if now - self._logged >= self.log_every_s and self.done < self.total:
            self._logged = now
            log.info(self.line())


def _duration(seconds: float) -> str:
    """``45 s``, ``3 min 20 s``, ``1 h 05 min``."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
