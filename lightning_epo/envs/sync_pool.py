"""The in-process environment pool: steps its environments one after another (for CPU-fast envs).

An environment that raises during ``reset`` or ``step`` does not stop the run: its slot reports
``StepResult(failed=True, observation="", info={"error": ...})`` (the collector truncates that episode)
and the slot gets a fresh environment from the suite, ready for its next ``reset``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

from lightning_epo.core.errors import ConfigError
from lightning_epo.envs.base import EnvPool, StepResult, Task, TaskSuite, TextEnv

log = logging.getLogger(__name__)


class SyncEnvPool(EnvPool):
    """``size`` environments from ``suite.make_env()``, reset and stepped sequentially in this process."""

    def __init__(self, suite: TaskSuite, size: int) -> None:
        if size < 1:
            raise ConfigError(f"env.pool_size must be >= 1, got {size}")
        self.suite = suite
        self.size = size
        self.envs: list[TextEnv] = [suite.make_env() for _ in range(size)]

    def reset(self, slots: list[int], tasks: list[Task]) -> list[StepResult]:
        """Reset ``slots[i]`` to ``tasks[i]``."""
        self._check_open()
        self.check_slots(slots, tasks, "tasks")
        return [self._call(slot, "reset", partial(_reset, task=task)) for slot, task in zip(slots, tasks)]

    def step(self, slots: list[int], actions: list[str]) -> list[StepResult]:
        """Step ``slots[i]`` with ``actions[i]``, one slot after the other."""
        self._check_open()
        self.check_slots(slots, actions, "actions")
        return [self._call(slot, "step", partial(_step, action=action)) for slot, action in zip(slots, actions)]

    def close(self) -> None:
        """Close every environment (all are tried; the first error is raised after the others closed)."""
        errors = []
        for env in self.envs:
            try:
                env.close()
            except Exception as error:  # noqa: BLE001 - keep closing the rest, re-raise below
                errors.append(error)
        self.envs = []
        if errors:
            raise errors[0]

    def _call(self, slot: int, what: str, call: Callable[[TextEnv], StepResult]) -> StepResult:
        """Run ``call`` on the slot's env; on an exception, replace the env and report a failed result."""
        try:
            return call(self.envs[slot])
        except Exception as error:  # noqa: BLE001 - any env failure truncates the episode, the run goes on
            message = f"{type(error).__name__}: {error}"
            log.warning("env slot %d failed in %s (%s); replacing it with a fresh env", slot, what, message)
            self._replace(slot)
            return StepResult(observation="", info={"error": message}, failed=True)

    def _replace(self, slot: int) -> None:
        """Swap in a fresh env; the broken one is closed on a best-effort basis."""
        broken, self.envs[slot] = self.envs[slot], self.suite.make_env()
        try:
            broken.close()
        except Exception as error:  # noqa: BLE001 - the env is already broken; its close may be too
            log.warning("closing the failed env of slot %d raised %s: %s", slot, type(error).__name__, error)

    def _check_open(self) -> None:
        """A closed pool has no environments left to use."""
        if not self.envs:
            raise RuntimeError("SyncEnvPool is closed; build a new pool")


def _reset(env: TextEnv, task: Task) -> StepResult:
    observation, info = env.reset(task)
    return StepResult(observation=observation, info=info)


def _step(env: TextEnv, action: str) -> StepResult:
    observation, reward, done, info = env.step(action)
    return StepResult(observation=observation, reward=reward, done=done, info=info)
