"""ALFWorld (text engine) behind the DESIGN.md environment contract (``env=alfworld``).

Each game is a ``game.tw-pddl`` file (see :mod:`lightning_epo.envs.alfworld_data` for where they
live). The shipped games have no ``traj_data.json``, so ALFWorld's ``AlfredTWEnv`` (which scans for
it) is not used: each game is played by TextWorld's PDDL engine directly, wrapped in ALFWorld's
``AlfredDemangler`` (object names such as ``desk 1``), exactly the engine ``AlfredTWEnv`` runs.

Splits (as in verl-agent and EPO): ``train`` = ``json_2.1.1/train`` (3553 games), ``iid`` =
``valid_seen`` (140), ``ood`` = ``valid_unseen`` (134).

Behaviour worth knowing:

- Observations: the first one drops TextWorld's ``-= Welcome to TextWorld, ALFRED! =-`` banner;
  ``info["task"]`` is the sentence after ``Your task is to:``. ``info["admissible_actions"]`` is the
  game's list minus ``help`` (as in verl-agent).
- Actions are compared after lower-casing and collapsing whitespace. An action not in the admissible
  list gets ``info["action_valid"] = False`` and is still passed to the game (as verl-agent does),
  which answers ``Nothing happens.`` and leaves the state unchanged; the episode goes on.
- ``won`` is the game's own goal check; reward is ``success_reward`` on the winning step, else 0, and
  ``done`` is True only then. The engine has no step limit of its own: the collector's
  ``env.max_turns`` ends unfinished episodes.
- ``info["expert_action"]``: the next action of the game file's stored walkthrough (an expert plan
  that wins), kept in step while the agent follows it; inadmissible actions (which the game rejects)
  keep it. After any other admissible action the walkthrough no longer applies and
  ``expert_action`` is ``None`` for the rest of the episode (and once won). Replanning from the
  agent's state with ALFWorld's PDDL planner was measured at 10-18 s per call in kitchens, too slow
  to do on every step.
- Loading a game costs about 1 s and ``reset`` another ~0.5-1 s (TextWorld translates the PDDL twice);
  a step costs 45-150 ms. Each instance keeps up to ``cache_size`` games loaded (LRU), so a game
  seen again in the same worker skips the load. Engines are reused, never discarded: every new
  TextWorld PDDL engine maps its own copy of fast-downward's library, which is never unloaded.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

from lightning_epo.core.errors import ConfigError
from lightning_epo.envs.alfworld_data import FIX_HINT, GAME_FILE, GAMES_ROOT, resolve_data_dir
from lightning_epo.envs.base import Task, TaskSuite, TextEnv

PROMPT_INTRO = "You are an expert agent operating in the ALFRED Embodied Environment."  # the prompt's first sentence
SPLIT_FOLDERS = {"train": "train", "iid": "valid_seen", "ood": "valid_unseen"}
BANNER_PREFIX = "-= Welcome to TextWorld"
TASK_PREFIX = "Your task is to: "
HIDDEN_ACTIONS = frozenset({"help"})


def task_type(game_file: str | os.PathLike) -> str:
    """The ALFWorld task type of a game, from its task folder (``pick_cool_then_place_in_recep-Apple-...``)."""
    return Path(game_file).parent.parent.name.split("-", 1)[0]


class AlfWorldSuite(TaskSuite):
    """ALFWorld's games by split, in sorted path order. Plain kwargs, so Hydra can build and pickle it.

    Args:
        data_dir: folder holding ``json_2.1.1/``; ``None`` means ``$ALFWORLD_DATA``, else ``data/alfworld``.
        success_reward: reward of the winning step.
        cache_size: games each environment keeps loaded (see :class:`AlfWorldEnv`).
    """

    def __init__(self, data_dir: str | None = None, success_reward: float = 10.0, cache_size: int = 4) -> None:
        self.data_dir = str(resolve_data_dir(data_dir))
        if not Path(self.data_dir, GAMES_ROOT).is_dir():
            raise ConfigError(f"no ALFWorld games at {self.data_dir}/{GAMES_ROOT}: {FIX_HINT}")
        if cache_size < 1:
            raise ConfigError(f"env.suite.cache_size must be at least 1, got {cache_size}")
        self.success_reward = float(success_reward)
        self.cache_size = int(cache_size)
        self._tasks: dict[str, list[Task]] = {}

    def tasks(self, split: str) -> list[Task]:
        """All games of ``split`` (``train``, ``iid``, ``ood``); ``variation`` is the path relative to ``data_dir``."""
        if split not in SPLIT_FOLDERS:
            raise ConfigError(f"unknown ALFWorld split {split!r}; choose one of {sorted(SPLIT_FOLDERS)}")
        if split not in self._tasks:
            root = Path(self.data_dir)
            folder = root / GAMES_ROOT / SPLIT_FOLDERS[split]
            games = sorted(folder.glob(f"*/*/{GAME_FILE}"))
            if not games:
                raise ConfigError(f"no ALFWorld games (*/*/{GAME_FILE}) in {folder}: {FIX_HINT}")
            self._tasks[split] = [Task(split, task_type(g), g.relative_to(root).as_posix()) for g in games]
        return list(self._tasks[split])

    def make_env(self) -> AlfWorldEnv:
        return AlfWorldEnv(self.data_dir, success_reward=self.success_reward, cache_size=self.cache_size)


def _make_engine():
    """A TextWorld PDDL engine wrapped in ALFWorld's name demangler, with walkthroughs requested.

    Importing ``alfworld`` creates ``$ALFWORLD_DATA`` (default ``~/.cache/alfworld``) and sets the
    variable for the whole process; it is restored so that later data-dir resolution is unaffected.
    """
    saved = os.environ.get("ALFWORLD_DATA")
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
    from textworld.envs.pddl import PddlEnv

    if saved is None:
        os.environ.pop("ALFWORLD_DATA", None)
    infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["walkthrough"])
    return AlfredDemangler(shuffle=False)(PddlEnv(infos))


def _normalize(action: str) -> str:
    return " ".join(action.lower().split())


class AlfWorldEnv(TextEnv):
    """One ALFWorld player; see the module docstring for observations, rewards and the expert."""

    def __init__(self, data_dir: str | os.PathLike | None = None, success_reward: float = 10.0, cache_size: int = 4):
        self.data_dir = resolve_data_dir(data_dir)
        self.success_reward = float(success_reward)
        self.cache_size = int(cache_size)
        self._engines: OrderedDict[Path, Any] = OrderedDict()  # game file -> loaded engine, LRU last
        self._engine = None
        self._task_text = ""
        self._admissible: list[str] = []
        self._plan: list[str] = []
        self._plan_pos = 0
        self._done = True

    def _load(self, game_file: Path):
        """The engine holding ``game_file``: cached, else the least recently used one (or a new one) reloaded."""
        if game_file in self._engines:
            self._engines.move_to_end(game_file)
            return self._engines[game_file]
        if len(self._engines) >= self.cache_size:
            engine = self._engines.popitem(last=False)[1]
        else:
            engine = _make_engine()
        engine.load(str(game_file))
        self._engines[game_file] = engine
        return engine

    def reset(self, task: Task) -> tuple[str, dict[str, Any]]:
        game_file = self.data_dir / str(task.variation)
        if not game_file.is_file():
            raise ValueError(f"ALFWorld game {game_file} not found (task {task}): {FIX_HINT}")
        self._engine = self._load(game_file)
        state = self._engine.reset()
        observation = state.feedback.strip()
        if observation.startswith(BANNER_PREFIX):
            observation = observation.split("\n\n", 1)[-1].strip()
        self._task_text = observation.split(TASK_PREFIX, 1)[-1].strip() if TASK_PREFIX in observation else ""
        self._plan, self._plan_pos = list(state["extra.walkthrough"]), 0
        self._done = False
        return observation, self._info(state)

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        if self._done:
            raise RuntimeError("AlfWorldEnv.step() called with no episode running: call reset(task) first")
        action = _normalize(action)
        valid = action in self._admissible
        state, _, _ = self._engine.step(action)
        if valid:
            self._follow_plan(action)
        won = bool(state["won"])
        self._done = won
        info = self._info(state)
        info["action_valid"] = valid
        return state.feedback.strip(), self.success_reward if won else 0.0, won, info

    def _follow_plan(self, action: str) -> None:
        """Advance the walkthrough on its own action; drop it after any other (admissible) action."""
        if self._plan_pos < len(self._plan) and action == self._plan[self._plan_pos]:
            self._plan_pos += 1
        else:
            self._plan, self._plan_pos = [], 0

    def _info(self, state) -> dict[str, Any]:
        self._admissible = [a for a in state["admissible_commands"] if a not in HIDDEN_ACTIONS]
        won = bool(state["won"])
        on_plan = not won and self._plan_pos < len(self._plan)
        return {
            "task": self._task_text,
            "admissible_actions": list(self._admissible),
            "won": won,
            "expert_action": self._plan[self._plan_pos] if on_plan else None,
        }

    def close(self) -> None:
        for engine in self._engines.values():
            engine.close()
        self._engines.clear()
        self._engine = None
        self._done = True
