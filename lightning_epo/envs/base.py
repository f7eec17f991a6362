"""The environment contract (DESIGN.md, "Environment contract").

Every environment is a text environment with a Gym-like interface:

    reset(task) -> (observation, info)
    step(action) -> (observation, reward, done, info)

``info`` always holds:

- ``won`` (bool): true success as the simulator defines it; never inferred from ``done`` or a step cap.
- ``task`` (str): the natural-language task description shown in the prompt.
- ``admissible_actions`` (list[str] | None): the actions valid now, where the environment has them.
- ``action_valid`` (bool, after ``step``): False when the simulator did not accept the action;
  the collector then charges the invalid-action penalty and the episode goes on.
- ``expert_action`` (str | None): the next action of the environment's own expert, where it has one
  and it is cheap (``rollout=expert`` uses it).

Environments live behind an :class:`EnvPool` so that real simulators can run in worker processes.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Task:
    """One playable task: enough to rebuild the same episode start anywhere (any process, any rank).

    ``split`` is ``train`` or an evaluation split (``iid``, ``ood``, ``heldout``); ``name`` is the task
    family (e.g. ``boil`` or ``pick_and_place``), ``variation`` the instance inside it (a seed,
    a ScienceWorld variation index, an ALFWorld game path).
    """

    split: str
    name: str
    variation: int | str


@dataclass
class StepResult:
    """What a pool returns for one environment slot after ``reset`` or ``step``.

    ``failed`` is True when the worker crashed or timed out; the episode is then truncated.
    """

    observation: str
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    failed: bool = False


class TextEnv(abc.ABC):
    """One environment instance (lives in one process)."""

    @abc.abstractmethod
    def reset(self, task: Task) -> tuple[str, dict[str, Any]]:
        """Start ``task``; return the first observation and ``info``."""

    @abc.abstractmethod
    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        """Apply one parsed action; return observation, reward, done, info."""

    def close(self) -> None:
        """Release simulator resources (a JVM, files)."""


class TaskSuite(abc.ABC):
    """The tasks of one environment family, by split. Cheap to build; lives in the trainer process."""

    @abc.abstractmethod
    def tasks(self, split: str) -> list[Task]:
        """All tasks of ``split`` in a fixed order; raises ValueError naming the fix if empty or unknown."""

    @abc.abstractmethod
    def make_env(self) -> TextEnv:
        """A new environment instance (called inside a worker process for process pools)."""


class EnvPool(abc.ABC):
    """A fixed number of environment slots stepped together."""

    size: int

    @abc.abstractmethod
    def reset(self, slots: list[int], tasks: list[Task]) -> list[StepResult]:
        """Reset ``slots[i]`` to ``tasks[i]``."""

    @abc.abstractmethod
    def step(self, slots: list[int], actions: list[str]) -> list[StepResult]:
        """Step ``slots[i]`` with ``actions[i]`` (in parallel where the pool can)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop every environment; no process may be left behind."""

    def check_slots(self, slots: list[int], values: Sequence[object], kind: str) -> None:
        """One value (task or action) per slot, and distinct slots in ``[0, size)``; a ValueError naming the fix."""
        if len(slots) != len(values):
            raise ValueError(f"got {len(slots)} slots but {len(values)} {kind}; pass one per slot")
        if len(set(slots)) != len(slots) or any(not 0 <= s < self.size for s in slots):
            raise ValueError(f"slots must be distinct integers in [0, {self.size}), got {slots}")

    def __enter__(self) -> "EnvPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
