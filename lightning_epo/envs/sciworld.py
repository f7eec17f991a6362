"""ScienceWorld (``env=sciworld``) behind the environment contract (DESIGN.md, "Environment contract").

Splits, as in RLVMR and EPO. The task indices 0-28 are the positions in the simulator's own
(alphabetical) task list, whose 30th task, ``use-thermometer``, is left out. Each split takes, per
task, one of the simulator's variation sets:

================  ==========================================  ==========================
split             ``split_level: standard``                   ``split_level: heldout``
================  ==========================================  ==========================
``train``         all 29 tasks, train variations              the 19 others, train
``iid``           all 29 tasks, dev variations                the 19 others, dev
``ood``           all 29 tasks, test variations               the 19 others, test
``heldout``       (not available)                             the 10 held-out tasks, test
================  ==========================================  ==========================

Listing variations needs a JVM, so the lists are kept in a small JSON file
(``data/sciworld_variations.json``, made on first use by :func:`list_variations` and tied to the
installed ScienceWorld version); a suite reads it once and keeps it in memory.

Departures from the RLVMR/EPO wrapper, and why:

- Steps call the simulator directly instead of ``ScienceWorldEnv.step``, which lists every valid
  action-object combination after each step (about 100 ms a step against 20 ms here, measured on
  a laptop-class CPU): the prompt only needs the action templates and the objects present.
- ``won`` is the simulator's own completion with a positive score. The reference code took
  ``done and score > 0``, where ``done`` also fires at the wrapper's step limit.
- ScienceWorld's step limit (``envStepLimit``) lives in ``ScienceWorldEnv.step``, which is not used
  here, so the simulator never ends an episode by a cap; the collector's ``env.max_turns`` does.
  (A cap on the simulator's move counter would cut episodes early: ``wait`` counts 10 moves.)
- ``reset`` loads the task and looks around; it skips ``ScienceWorldEnv.reset``, which loads the
  task a second time (9-14 s for the genetics tasks).

The simulator is not fully deterministic for one (task, variation): plants and heat transfer can
differ between loads (ScienceWorld issue #33), so groups of rollouts of one task may see slightly
different worlds. The gold path is generated at each load; in the genetics tasks a few of its
steps can be rejected by the world that was loaded, and it still wins.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lightning_epo.core.errors import ConfigError, UserError
from lightning_epo.envs.base import Task, TaskSuite, TextEnv
from lightning_epo.envs.sciworld_prompt import INTRO as PROMPT_INTRO  # noqa: F401 (its prompt: sciworld_prompt.py)

EXCLUDED_TASK = "use-thermometer"
NUM_TASKS = 29
# Task indices 1, 4, 8, 11, 13, 16, 18, 21, 24, 28 of the 29-task list (RLVMR/EPO's held-out level).
HELDOUT_TASKS = (
    "change-the-state-of-matter-of",
    "chemistry-mix-paint-tertiary-color",
    "find-plant",
    "grow-plant",
    "identify-life-stages-2",
    "inclined-plane-friction-unnamed-surfaces",
    "lifespan-longest-lived-then-shortest-lived",
    "measure-melting-point-unknown-substance",
    "mendelian-genetics-unknown-plant",
    "test-conductivity-of-unknown-substances",
)
SPLIT_LEVELS = ("standard", "heldout")
# Split -> the simulator's variation set it draws from.
SPLIT_VARIATIONS = {"train": "train", "iid": "dev", "ood": "test", "heldout": "test"}
SIMPLIFICATIONS = (
    "easy",
    "teleportAction",
    "selfWateringFlowerPots",
    "openContainers",
    "openDoors",
    "noElectricalAction",
)
# The simulator's replies to input it could not act on: the input matched no action, or it was not
# a number after an "Ambiguous request" question.
INVALID_ACTION_REPLIES = ("No known action matches that input.", "Unknown action.")
# The last admissible_actions entry: the objects present, in the EPO code's words (shown after the templates).
OBJECTS_LINE = "OBJ needs to be replaced with one of the following objects: "
DEFAULT_VARIATIONS_PATH = Path(__file__).resolve().parents[2] / "data" / "sciworld_variations.json"
_TASK_PREFIX = "Your task is to "


class TaskNames:
    """The 29 task names as the shipped variations file lists them (no JVM): what ``env.suite.task_subset`` may name
    (its rule in lightning_epo/runtime/config.py, checked before the run begins)."""

    def __init__(self, path: Path = DEFAULT_VARIATIONS_PATH) -> None:
        self.path = path

    def names(self) -> list[str]:
        return list(json.loads(self.path.read_text()).get("tasks", {})) if self.path.is_file() else []


TASK_NAMES = TaskNames()


def scienceworld_version() -> str:
    """The installed ScienceWorld version; a one-line error naming the fix when it is missing."""
    try:
        return importlib.metadata.version("scienceworld")
    except importlib.metadata.PackageNotFoundError:
        raise UserError("env=sciworld needs ScienceWorld: run `pip install scienceworld==1.2.3`") from None


def java_executable() -> str | None:
    """The ``java`` that ScienceWorld's JVM starts with: ``$JAVA_HOME/bin/java``, else the one on PATH (or None)."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and Path(java_home, "bin", "java").exists():
        return str(Path(java_home, "bin", "java"))
    return shutil.which("java")


def require_simulator() -> None:
    """Raise a one-line error naming the fix when ScienceWorld or Java is missing."""
    scienceworld_version()
    if java_executable() is None:
        raise UserError(
            "env=sciworld needs Java on PATH (or JAVA_HOME): install a JRE, "
            "e.g. `apt-get install openjdk-17-jre-headless`"
        )


@contextlib.contextmanager
def _java_heap(heap_mb: int) -> Iterator[None]:
    """Cap the heap of JVMs started inside this block (ScienceWorldEnv has no JVM-options argument).

    The option goes through ``JAVA_TOOL_OPTIONS``, which the JVM reads at start; it is appended to
    any value the user set, so it wins over an ``-Xmx`` there, and the old value is restored after.
    ``os.environ`` is process-wide: start simulators from one thread at a time (pools run one
    environment per worker process).
    """
    old = os.environ.get("JAVA_TOOL_OPTIONS")
    os.environ["JAVA_TOOL_OPTIONS"] = f"{old or ''} -Xmx{heap_mb}m".strip()
    try:
        yield
    finally:
        if old is None:
            del os.environ["JAVA_TOOL_OPTIONS"]
        else:
            os.environ["JAVA_TOOL_OPTIONS"] = old


class Simulator:
    """One ScienceWorld JVM with a capped heap; ``close`` waits for the JVM to exit (kills it if it must)."""

    def __init__(self, jvm_heap_mb: int) -> None:
        require_simulator()
        from scienceworld import ScienceWorldEnv

        with _java_heap(jvm_heap_mb):
            self.env = ScienceWorldEnv("")
        self.server = self.env.server  # the JVM-side interface: the lean calls go straight to it
        self.process: subprocess.Popen = self.env._gateway.java_process  # no public handle on the JVM process

    def close(self) -> None:
        self.env.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def list_variations(jvm_heap_mb: int = 512) -> dict[str, dict[str, list[int]]]:
    """The 29 tasks (index order) and their ``train``/``dev``/``test`` variations, from one short-lived JVM."""
    sim = Simulator(jvm_heap_mb)
    try:
        names = [name for name in sim.env.get_task_names() if name != EXCLUDED_TASK]
        if len(names) != NUM_TASKS:
            raise UserError(f"ScienceWorld lists {len(names) + 1} tasks, expected 30: install scienceworld==1.2.3")
        variations = {}
        for name in names:
            sim.server.load(name, 0, "", False)
            variations[name] = {
                "train": [int(v) for v in sim.server.getVariationsTrain()],
                "dev": [int(v) for v in sim.server.getVariationsDev()],
                "test": [int(v) for v in sim.server.getVariationsTest()],
            }
        return variations
    finally:
        sim.close()


def _check_simplification(simplification: str) -> None:
    unknown = [s for s in simplification.split(",") if s and s not in SIMPLIFICATIONS]
    if unknown:
        raise ConfigError(
            f"unknown ScienceWorld simplification(s) {unknown} in {simplification!r}: use a comma-separated "
            f"subset of {', '.join(SIMPLIFICATIONS)} (or '' for none)"
        )


class SciWorldEnv(TextEnv):
    """One ScienceWorld episode at a time in its own JVM (heap capped at ``jvm_heap_mb``).

    ``info`` after ``reset`` and ``step``:

    - ``won``: the simulator marked the task completed with a positive score;
    - ``task``: the task description (without its leading "Your task is to ");
    - ``admissible_actions``: the simulator's action templates, then one entry
      ``"OBJ needs to be replaced with one of the following objects: [...]"`` listing the objects present
      (what the prompt shows, in the EPO code's words);
    - ``score``: ScienceWorld's own score (0-100, negative when the task failed);
    - ``action_valid`` (after ``step``): False when the simulator answered that nothing matches;
    - ``expert_action``: the next action of the gold path, when ``gold_path`` is on. The path is
      followed while the agent plays its next action (or an action the simulator rejects, which
      changes nothing); after any other action it is ``None`` for the rest of the episode, as it is
      when the path is used up or ``gold_path`` is off (making the path costs 0.2-15 s per reset).

    ``reward`` is ``success_reward`` on the winning step, else 0 (the paper's sparse reward), plus, where
    ``score_reward`` > 0 (``env.suite.score_reward``, an option; 0 by default), the score's progress at each step:
    ``score_reward * (max(score_t, 0) - max(score_{t-1}, 0)) / 100``, a failure's negative score counted as 0. An
    episode's progress rewards sum to ``score_reward * (final - first) / 100``, the first being the score after
    ``reset``: a failed task gives back all the progress earned before it. With ``failure_keeps_progress``
    (``env.suite.failure_keeps_progress``, an option) the failing step's progress is 0 instead: the episode keeps
    what it earned, and a wrong attempt costs only the progress and the win still to come. ``done`` is the
    simulator's completion or failure (a negative score).
    """

    def __init__(
        self,
        simplification: str = "easy",
        jvm_heap_mb: int = 512,
        success_reward: float = 10.0,
        gold_path: bool = False,
        score_reward: float = 0.0,
        failure_keeps_progress: bool = False,
    ) -> None:
        _check_simplification(simplification)
        self.simplification = simplification
        self.success_reward = success_reward
        self.gold_path = gold_path
        self.score_reward = score_reward
        self.failure_keeps_progress = failure_keeps_progress
        self._score = 0  # max(score, 0) after the last reset or step
        self._sim: Simulator | None = Simulator(jvm_heap_mb)
        self._task = ""
        self._templates: list[str] = []
        self._gold: list[str] | None = None
        self._gold_idx = 0

    @property
    def pid(self) -> int | None:
        """The JVM's process id, None once closed."""
        return None if self._sim is None else self._sim.process.pid

    def _server(self) -> Any:
        if self._sim is None:
            raise RuntimeError("this SciWorldEnv is closed: make a new one with suite.make_env()")
        return self._sim.server

    def reset(self, task: Task) -> tuple[str, dict[str, Any]]:
        server = self._server()
        # The public load() checks the task name and simplifications with clear errors.
        self._sim.env.load(task.name, int(task.variation), self.simplification, generateGoldPath=self.gold_path)
        self._task = str(server.getTaskDescription()).removeprefix(_TASK_PREFIX)
        self._templates = [str(t) for t in server.getPossibleActions()]
        self._gold = [str(a) for a in server.getGoldActionSequence()] if self.gold_path else None
        self._gold_idx = 0
        observation = str(server.step("look around"))
        info = self._info(server)
        self._score = max(info["score"], 0)
        return observation, info

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        server = self._server()
        if not self._templates:
            raise RuntimeError("SciWorldEnv.step before reset: call reset(task) first")
        observation = str(server.step(action))
        valid = not observation.startswith(INVALID_ACTION_REPLIES)
        self._follow_gold(action, valid)
        info = self._info(server)
        info["action_valid"] = valid
        done = info["won"] or info["score"] < 0  # the simulator completes a task only when it is won
        reward = self.success_reward if info["won"] else 0.0
        kept = info["score"] < 0 and self.failure_keeps_progress
        score, self._score = self._score, self._score if kept else max(info["score"], 0)
        reward += self.score_reward * (self._score - score) / 100
        return observation, reward, done, info

    def _follow_gold(self, action: str, valid: bool) -> None:
        if self._gold is None:
            return
        if self._gold_idx < len(self._gold) and action.strip().lower() == self._gold[self._gold_idx].lower():
            self._gold_idx += 1
        elif valid:
            self._gold = None

    def _info(self, server: Any) -> dict[str, Any]:
        score = int(round(100 * server.getScore()))
        objects = [str(o) for o in server.getPossibleObjects()]
        on_path = self._gold is not None and self._gold_idx < len(self._gold)
        return {
            "won": bool(server.getCompleted()) and score > 0,
            "task": self._task,
            "admissible_actions": [*self._templates, f"{OBJECTS_LINE}{objects}"],
            "score": score,
            "expert_action": self._gold[self._gold_idx] if on_path else None,
        }

    def close(self) -> None:
        """Stop the JVM and wait for it to exit; safe to call twice."""
        if self._sim is not None:
            self._sim.close()
            self._sim = None


class SciWorldSuite(TaskSuite):
    """The ScienceWorld tasks by split (see the module docstring); plain kwargs, picklable, JVM-free.

    ``variations_path`` is the JSON list of variations (made with a JVM when missing or made by
    another ScienceWorld version). ``task_subset`` (``env.suite.task_subset``): task names that every split keeps
    (null: all), checked here, at start, in one line naming the valid ones. The other arguments go to each
    :class:`SciWorldEnv`.
    """

    def __init__(
        self,
        split_level: str = "standard",
        simplification: str = "easy",
        jvm_heap_mb: int = 512,
        success_reward: float = 10.0,
        gold_path: bool = False,
        variations_path: str | None = None,
        task_subset: list[str] | None = None,
        score_reward: float = 0.0,
        failure_keeps_progress: bool = False,
    ) -> None:
        if split_level not in SPLIT_LEVELS:
            raise ConfigError(f"unknown env.suite.split_level {split_level!r}: use one of {', '.join(SPLIT_LEVELS)}")
        _check_simplification(simplification)
        require_simulator()  # here, in the parent at start: a worker's JVM start would bury the message
        self.split_level = split_level
        self.simplification = simplification
        self.jvm_heap_mb = jvm_heap_mb
        self.success_reward = success_reward
        if failure_keeps_progress and not score_reward > 0:
            raise ConfigError("env.suite.failure_keeps_progress=true changes only the score's progress reward: set "
                              "env.suite.score_reward > 0 as well (e.g. 10), or leave it false")
        self.score_reward = score_reward
        self.failure_keeps_progress = failure_keeps_progress
        self.gold_path = gold_path
        self.variations_path = Path(variations_path) if variations_path else DEFAULT_VARIATIONS_PATH
        self._variations: dict[str, dict[str, list[int]]] | None = None
        if isinstance(task_subset, str):
            raise ConfigError(f"env.suite.task_subset must be a list of task names, got {task_subset!r}: write "
                              f"env.suite.task_subset=[{task_subset}]")
        self.task_subset = None if task_subset is None else [str(name) for name in task_subset]
        if self.task_subset is not None:
            self._check_subset(self.task_subset)

    def _check_subset(self, subset: list[str]) -> None:
        valid = list(self.variations())
        unknown = [name for name in subset if name not in valid]
        if unknown or not subset:
            what = f"names no ScienceWorld task: {', '.join(unknown)}" if unknown else "is empty"
            raise ConfigError(f"env.suite.task_subset {what}; give task names from: {', '.join(valid)} "
                              "(or env.suite.task_subset=null for all 29)")
        if self.split_level == "heldout" and not set(subset) & set(HELDOUT_TASKS):
            raise ConfigError("env.suite.task_subset holds none of the held-out tasks (split_level=heldout tests on "
                              f"them): add some of {', '.join(HELDOUT_TASKS)}, or set env.suite.split_level=standard")
        if self.split_level == "heldout" and set(subset) <= set(HELDOUT_TASKS):
            raise ConfigError("env.suite.task_subset holds only held-out tasks (split_level=heldout trains on the "
                              "others): add tasks outside the held-out ten, or set env.suite.split_level=standard")

    def task_names(self, split: str) -> list[str]:
        """The task names of ``split`` in index order."""
        if split not in SPLIT_VARIATIONS:
            raise ConfigError(f"unknown ScienceWorld split {split!r}: use one of {', '.join(SPLIT_VARIATIONS)}")
        if split == "heldout" and self.split_level != "heldout":
            raise ConfigError(
                "the ScienceWorld 'heldout' split needs env.suite.split_level=heldout "
                "(or drop heldout from env.eval_splits)"
            )
        names = [n for n in self.variations() if self.task_subset is None or n in self.task_subset]
        if self.split_level == "standard":
            return names
        if split == "heldout":
            return [n for n in names if n in HELDOUT_TASKS]
        return [n for n in names if n not in HELDOUT_TASKS]

    def tasks(self, split: str) -> list[Task]:
        names = self.task_names(split)
        which = SPLIT_VARIATIONS[split]
        tasks = [Task(split, name, v) for name in names for v in self.variations()[name][which]]
        if not tasks:
            raise UserError(
                f"ScienceWorld split {split!r} is empty: delete {self.variations_path} so that it is listed again"
            )
        return tasks

    def variations(self) -> dict[str, dict[str, list[int]]]:
        """Task name -> ``{"train"|"dev"|"test": [variation, ...]}`` for the 29 tasks, in index order."""
        if self._variations is None:
            self._variations = self._load_or_list_variations()
        return self._variations

    def _load_or_list_variations(self) -> dict[str, dict[str, list[int]]]:
        version = scienceworld_version()
        if self.variations_path.exists():
            stored = json.loads(self.variations_path.read_text())
            if stored.get("scienceworld") == version and len(stored.get("tasks", {})) == NUM_TASKS:
                return stored["tasks"]
        variations = list_variations(self.jvm_heap_mb)
        self.variations_path.parent.mkdir(parents=True, exist_ok=True)
        payload = {"scienceworld": version, "tasks": variations}
        self.variations_path.write_text(json.dumps(payload, separators=(",", ":")) + "\n")
        return variations

    def make_env(self) -> SciWorldEnv:
        return SciWorldEnv(
            simplification=self.simplification,
            jvm_heap_mb=self.jvm_heap_mb,
            success_reward=self.success_reward,
            gold_path=self.gold_path,
            score_reward=self.score_reward,
            failure_keeps_progress=self.failure_keeps_progress,
        )
