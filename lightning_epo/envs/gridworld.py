"""GridWorld: the built-in, procedurally generated text environment (``env=gridworld``).

It exists so that the whole RL loop runs, and learns, on a CPU in minutes with a tiny random LLM.
An ``N x N`` grid holds a few walls, the agent and one goal object. The agent must walk to the
object (one cell per ``go <direction>``) and then use it (``pick up key`` or ``open door``).

- Observations are one or two short sentences that make the right action inferable: where the
  goal is relative to the agent ("The key is 2 steps north and 1 step east.") and which neighbouring
  cells are blocked ("Walls to the north and west."; the grid's edge counts as a wall).
- ``info["admissible_actions"]`` lists the moves into free cells, plus the goal's action when the
  agent stands on the goal. Any other text is invalid: nothing changes, the observation starts with
  "Nothing happens." and ``info["action_valid"]`` is False.
- The reward is sparse: ``success_reward`` on the winning step, 0 otherwise; ``done`` only on success
  (or at the generous safety cap :data:`SAFETY_STEP_CAP`, without ``won``). The collector caps turns.
- The expert (``info["expert_action"]``) follows a BFS shortest path and always wins; an episode's
  shortest solution is its start-to-goal distance plus one (the goal's action).
- Splits: ``train`` and ``iid`` draw layouts from the same distribution (iid keeps only layouts that
  no train task has); ``ood`` uses a larger grid and longer distances.

A task's layout is a pure function of (split settings, ``Task.name``, ``Task.variation``), so any
process rebuilds the same episode from the :class:`~lightning_epo.envs.base.Task` alone.
"""

from __future__ import annotations

import itertools
import random
from collections import deque
from dataclasses import dataclass
from typing import Any

from lightning_epo.core.errors import ConfigError
from lightning_epo.envs.base import Task, TaskSuite, TextEnv

PROMPT_INTRO = (  # the agent prompt's first sentence (lightning_epo/rollout/prompts.py builds the rest)
    "You are an expert agent operating in the GridWorld environment, a text-based grid "
    "in which you walk to the goal object one step at a time and then use it."
)
SPLITS = ("train", "iid", "ood")
SAFETY_STEP_CAP = 1000
MAX_LAYOUT_ATTEMPTS = 1000
# Each split draws its variations from its own block, so no seed is shared between splits.
_SPLIT_SEED_BLOCK = 10**6
_MOVES = {"north": (-1, 0), "south": (1, 0), "east": (0, 1), "west": (0, -1)}

Cell = tuple[int, int]


@dataclass(frozen=True)
class Goal:
    """One task family: the object to reach and the action that uses it."""

    obj: str
    action: str
    description: str
    done_text: str


GOALS = {
    "pick_up_key": Goal("key", "pick up key", "pick up the key", "You pick up the key. You win!"),
    "open_door": Goal("door", "open door", "open the door", "You open the door. You win!"),
}
ACTIONS = tuple(f"go {d}" for d in _MOVES) + tuple(g.action for g in GOALS.values())


@dataclass(frozen=True)
class LayoutSpec:
    """The distribution one split draws layouts from: grid size, wall share and start-to-goal distance."""

    size: int
    wall_density: float
    min_distance: int
    max_distance: int


@dataclass(frozen=True)
class Layout:
    """One generated grid: ``walls`` are blocked cells; ``start`` and ``goal`` are (row, column), row 0 north."""

    size: int
    walls: frozenset[Cell]
    start: Cell
    goal: Cell

    def free(self, cell: Cell) -> bool:
        """Whether ``cell`` is inside the grid and not a wall."""
        row, col = cell
        return 0 <= row < self.size and 0 <= col < self.size and cell not in self.walls


def _neighbour(cell: Cell, direction: str) -> Cell:
    d_row, d_col = _MOVES[direction]
    return cell[0] + d_row, cell[1] + d_col


def distances_from(layout: Layout, source: Cell) -> dict[Cell, int]:
    """BFS step counts from ``source`` to every reachable free cell."""
    dist = {source: 0}
    queue = deque([source])
    while queue:
        cell = queue.popleft()
        for direction in _MOVES:
            nxt = _neighbour(cell, direction)
            if nxt not in dist and layout.free(nxt):
                dist[nxt] = dist[cell] + 1
                queue.append(nxt)
    return dist


def generate_layout(spec: LayoutSpec, name: str, variation: int) -> Layout:
    """The layout of task family ``name``, instance ``variation``, drawn from ``spec`` (deterministic).

    The start-to-goal distance is drawn uniformly from ``[min_distance, max_distance]``; walls and start
    are redrawn until some free cell lies at exactly that BFS distance.
    """
    rng = random.Random(f"gridworld/{name}/{variation}")
    distance = rng.randint(spec.min_distance, spec.max_distance)
    cells = [(r, c) for r in range(spec.size) for c in range(spec.size)]
    num_walls = round(spec.wall_density * len(cells))
    for _ in range(MAX_LAYOUT_ATTEMPTS):
        walls = frozenset(rng.sample(cells, num_walls))
        start = rng.choice([c for c in cells if c not in walls])
        layout = Layout(spec.size, walls, start, start)
        at_distance = sorted(c for c, d in distances_from(layout, start).items() if d == distance)
        if at_distance:
            return Layout(spec.size, walls, start, rng.choice(at_distance))
    raise ConfigError(
        f"gridworld could not place a goal {distance} steps from the start on a {spec.size}x{spec.size} grid "
        f"in {MAX_LAYOUT_ATTEMPTS} tries; lower env.suite.wall_density or the distance range"
    )


def _count(n: int, direction: str) -> str:
    return f"{n} step{'s' if n != 1 else ''} {direction}"


def _join(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


class GridworldEnv(TextEnv):
    """One GridWorld game; ``specs`` maps each split to the layout distribution its tasks use."""

    def __init__(self, specs: dict[str, LayoutSpec], success_reward: float = 10.0) -> None:
        self.specs = dict(specs)
        self.success_reward = success_reward
        self._layout: Layout | None = None

    def reset(self, task: Task) -> tuple[str, dict[str, Any]]:
        """Build the task's layout and put the agent on its start cell."""
        if task.split not in self.specs:
            raise ValueError(f"gridworld has no split {task.split!r}; valid: {', '.join(self.specs)}")
        if task.name not in GOALS:
            raise ValueError(f"gridworld has no task family {task.name!r}; valid: {', '.join(GOALS)}")
        if not isinstance(task.variation, int):
            raise ValueError(f"gridworld task variations are int seeds, got {task.variation!r}")
        self._goal = GOALS[task.name]
        self._layout = generate_layout(self.specs[task.split], task.name, task.variation)
        self._to_goal = distances_from(self._layout, self._layout.goal)
        self._agent = self._layout.start
        self._steps = 0
        self._won = False
        return self._describe(), self._info()

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        """Apply ``action`` (case and spacing are normalised); an inadmissible one changes nothing."""
        if self._layout is None:
            raise RuntimeError("gridworld step() before reset(); reset the env with a task first")
        if self._won or self._steps >= SAFETY_STEP_CAP:
            raise RuntimeError("gridworld step() after the episode ended; reset the env with a new task")
        self._steps += 1
        command = " ".join(action.lower().split())
        valid = command in self._admissible()
        reward = 0.0
        if not valid:
            observation = "Nothing happens. " + self._describe()
        elif command == self._goal.action:
            self._won = True
            reward = self.success_reward
            observation = self._goal.done_text
        else:
            self._agent = _neighbour(self._agent, command.removeprefix("go "))
            observation = self._describe()
        done = self._won or self._steps >= SAFETY_STEP_CAP
        return observation, reward, done, {**self._info(), "action_valid": valid}

    def _admissible(self) -> list[str]:
        if self._won:
            return []
        moves = [f"go {d}" for d in _MOVES if self._layout.free(_neighbour(self._agent, d))]
        return moves + ([self._goal.action] if self._agent == self._layout.goal else [])

    def _expert_action(self) -> str | None:
        """The next action on a shortest path to the goal (first of north, south, east, west on ties)."""
        if self._won:
            return None
        if self._agent == self._layout.goal:
            return self._goal.action
        closer = self._to_goal[self._agent] - 1
        return next(f"go {d}" for d in _MOVES if self._to_goal.get(_neighbour(self._agent, d)) == closer)

    def _describe(self) -> str:
        """Where the goal is, relative to the agent, and the blocked neighbouring cells."""
        obj = self._goal.obj
        d_row = self._layout.goal[0] - self._agent[0]
        d_col = self._layout.goal[1] - self._agent[1]
        parts = []
        if d_row:
            parts.append(_count(abs(d_row), "north" if d_row < 0 else "south"))
        if d_col:
            parts.append(_count(abs(d_col), "west" if d_col < 0 else "east"))
        where = f"The {obj} is {' and '.join(parts)}." if parts else f"You are at the {obj}."
        walls = [d for d in _MOVES if not self._layout.free(_neighbour(self._agent, d))]
        if walls:
            where += f" Wall{'s' if len(walls) > 1 else ''} to the {_join(walls)}."
        return where

    def _info(self) -> dict[str, Any]:
        return {
            "won": self._won,
            "task": self._goal.description,
            "admissible_actions": self._admissible(),
            "expert_action": self._expert_action(),
        }


class GridworldSuite(TaskSuite):
    """GridWorld's tasks by split, built from plain keyword arguments (``conf/env/gridworld.yaml``).

    ``train`` and ``iid`` grids are ``size x size`` with start-to-goal distances in
    ``[min_distance, max_distance]``; ``ood`` grids are ``ood_size x ood_size`` with distances in
    ``[ood_min_distance, ood_max_distance]``. ``goals`` picks the task families (see :data:`GOALS`);
    tasks cycle through them. ``num_eval_tasks`` is the size of each evaluation split.
    """

    def __init__(
        self,
        size: int = 6,
        ood_size: int = 8,
        num_train_tasks: int = 1000,
        num_eval_tasks: int = 100,
        wall_density: float = 0.15,
        min_distance: int = 2,
        max_distance: int = 6,
        ood_min_distance: int = 7,
        ood_max_distance: int = 10,
        success_reward: float = 10.0,
        goals: tuple[str, ...] | list[str] = tuple(GOALS),
    ) -> None:
        if not 0.0 <= wall_density <= 0.5:
            raise ConfigError(f"env.suite.wall_density must be in [0, 0.5], got {wall_density}")
        for key, count in (("num_train_tasks", num_train_tasks), ("num_eval_tasks", num_eval_tasks)):
            if not 0 <= count < _SPLIT_SEED_BLOCK // 10:
                raise ConfigError(f"env.suite.{key} must be in [0, {_SPLIT_SEED_BLOCK // 10}), got {count}")
        unknown = [g for g in goals if g not in GOALS]
        if unknown or not goals:
            raise ConfigError(f"env.suite.goals must be a non-empty list of {', '.join(GOALS)}; got {list(goals)}")
        train = _spec("", size, wall_density, min_distance, max_distance)
        ood = _spec("ood_", ood_size, wall_density, ood_min_distance, ood_max_distance)
        self.specs = {"train": train, "iid": train, "ood": ood}
        self.num_tasks = {"train": num_train_tasks, "iid": num_eval_tasks, "ood": num_eval_tasks}
        self.goals = tuple(goals)
        self.success_reward = float(success_reward)
        self._tasks: dict[str, list[Task]] = {}

    def tasks(self, split: str) -> list[Task]:
        """The ``split``'s tasks in a fixed order (built once, then cached)."""
        if split not in SPLITS:
            raise ConfigError(f"gridworld has no split {split!r}; valid splits: {', '.join(SPLITS)}")
        if self.num_tasks[split] == 0:
            key = "num_train_tasks" if split == "train" else "num_eval_tasks"
            raise ConfigError(f"gridworld split {split!r} is empty; set env.suite.{key} >= 1")
        if split not in self._tasks:
            self._tasks[split] = self._build(split)
        return list(self._tasks[split])

    def make_env(self) -> GridworldEnv:
        """A fresh environment that can play every split of this suite."""
        return GridworldEnv(self.specs, self.success_reward)

    def _build(self, split: str) -> list[Task]:
        """Tasks cycle through the goal families over consecutive variations of the split's seed block;
        ``iid`` skips any (family, layout) that a train task already has (searching a bounded range)."""
        wanted = self.num_tasks[split]
        first = SPLITS.index(split) * _SPLIT_SEED_BLOCK
        searched = range(first, first + min(10 * wanted + 1000, _SPLIT_SEED_BLOCK))
        candidates = (Task(split, self.goals[v % len(self.goals)], v) for v in searched)
        if split == "iid":
            train = {self._fingerprint(t) for t in self.tasks("train")}
            candidates = (t for t in candidates if self._fingerprint(t) not in train)
        tasks = list(itertools.islice(candidates, wanted))
        if len(tasks) < wanted:
            raise ConfigError(
                f"gridworld found only {len(tasks)} iid layouts that no train task has, of {wanted} wanted; "
                "raise env.suite.size or lower env.suite.num_train_tasks / env.suite.num_eval_tasks"
            )
        return tasks

    def _fingerprint(self, task: Task) -> tuple[str, Layout]:
        """What makes two tasks the same game: the family and the layout."""
        return task.name, generate_layout(self.specs[task.split], task.name, task.variation)


def _spec(prefix: str, size: int, wall_density: float, min_distance: int, max_distance: int) -> LayoutSpec:
    """A validated :class:`LayoutSpec`; errors name the config key (``prefix`` is ``""`` or ``"ood_"``)."""
    if size < 2:
        raise ConfigError(f"env.suite.{prefix}size must be >= 2, got {size}")
    longest = 2 * (size - 1)
    if not 1 <= min_distance <= max_distance <= longest:
        raise ConfigError(
            f"env.suite.{prefix}min_distance/{prefix}max_distance must satisfy 1 <= min <= max <= {longest} "
            f"(2 * (size - 1) on a {size}x{size} grid), got {min_distance}/{max_distance}"
        )
    return LayoutSpec(size, wall_density, min_distance, max_distance)
