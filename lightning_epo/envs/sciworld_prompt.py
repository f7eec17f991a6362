"""ScienceWorld's own prompt text: the EPO code base's ScienceWorld prompt (WujiangXu/EPO,
``agent_system/environments/prompts/sciworld.py``, with the available-actions text its environment wrapper writes),
filled in by :class:`lightning_epo.rollout.prompts.PromptBuilder` (whose docstring lists the departures).

Two layouts of the same sentences (``env.prompt``, conf/env/sciworld.yaml):

- ``fixed_first: true`` (the default here, a departure: docs/design.md): the text every prompt shares first (the
  intro, the action list), then what is fixed for the episode (the task, its action templates and the example),
  then what is new each turn (the history, the observation, the objects present) and the instruction. Everything
  before the observation is then one prefix of every turn of an episode, and its first part one of every prompt,
  which the engine's prefix cache and the update's shared-prefix pass compute once.
- ``fixed_first: false``: the reference's order (intro, task, observation, action list, available actions).

``action_list`` is the 25-action list's form: ``full`` (the reference's JSON list with descriptions), ``compact``
(the action names with their descriptions on one line each, without the JSON) or ``none`` (no list: the task's
templates line names the actions that exist).

``actions_only`` (with ``env.history_length=0``, a departure): the history is every earlier action without its
observation, listed in a sentence of its own (:data:`ACTIONS_TAKEN`, "go to kitchen; pick up cat"); the reference lists
earlier actions only beside the last ``history_length`` observations, one ``[Step n, Action n: '...']`` entry each,
and shows no history at 0.

``transcript`` (``env.prompt.transcript``, lightning_epo/rollout/prompts.py): after the first turn's text, each turn
adds :func:`next_text` (the observation, the objects present, the instruction) to the chat.
"""

from __future__ import annotations

import json

from lightning_epo.core.errors import ConfigError

INTRO = (
    "You are an expert agent operating in the ScienceWorld environment, which is a text-based "
    "virtual environment centered around accomplishing tasks from the elementary science curriculum."
)
TASK = "Your current task is: {task}"
HISTORY_ENTRY = "[Step {n}, Observation {n}: '{observation}', Action {n}: '{action}']"
EARLIER_ENTRY = "[Step {n}, Action {n}: '{action}']"
# actions_only: the actions in their own words (4.3 SmolLM2 tokens an action against 15 in EARLIER_ENTRY)
ACTIONS_TAKEN = "Your last {count} action(s): {actions}"
ACTION_DESCRIPTIONS = (
    ("open OBJ", "open a container"),
    ("close OBJ", "close a container"),
    ("activate OBJ", "activate a device"),
    ("deactivate OBJ", "deactivate a device"),
    ("connect OBJ to OBJ", "connect electrical components"),
    ("disconnect OBJ", "disconnect electrical components"),
    ("use OBJ [on OBJ]", "use a device/item"),
    ("look around", "describe the current room"),
    ("look at OBJ", "describe an object in detail"),
    ("look in OBJ", "describe a container's contents"),
    ("read OBJ", "read a note or book"),
    ("move OBJ to OBJ", "move an object to a container"),
    ("pick up OBJ", "move an object to the inventory"),
    ("put down OBJ", "drop an inventory item"),
    ("pour OBJ into OBJ", "pour a liquid into a container"),
    ("dunk OBJ into OBJ", "dunk a container into a liquid"),
    ("mix OBJ", "chemically mix a container"),
    ("go to LOC", "move to a new location"),
    ("eat OBJ", "eat a food"),
    ("flush OBJ", "flush a toilet"),
    ("focus on OBJ", "signal intent on a task object"),
    ("wait", "take no action for 10 iterations"),
    ("wait1", "take no action for 1 iteration"),
    ("task", "describe current task"),
    ("inventory", "list your inventory"),
)
ACTIONS = "Here are the actions you may take:\n[\n{}\n]".format(
    ",\n".join(json.dumps({"action": a, "description": d}) for a, d in ACTION_DESCRIPTIONS)
)
ACTIONS_COMPACT = "Here are the actions you may take:\n{}".format(
    "\n".join(f"{a}: {d}" for a, d in ACTION_DESCRIPTIONS)
)
ACTION_LISTS = {"full": ACTIONS, "compact": ACTIONS_COMPACT, "none": None}
# The environment lists the task's templates, then the objects line (lightning_epo/envs/sciworld.py).
AVAILABLE = (
    "Current available actions:\nValid_actions: {templates}, {objects}\n example: <action>focus on door</action>"
)
# fixed_first: the templates (fixed at reset) before the observation, the objects line (new each step) after it.
AVAILABLE_TEMPLATES = "Current available actions:\nValid_actions: {templates}\n example: <action>focus on door</action>"
REASON = (
    "You should first reason step-by-step about the current situation. This reasoning process MUST be enclosed "
    "within <think> </think> tags.\nOnce you've finished your reasoning, you should choose an appropriate action "
    "for the current step and present it within <action> </action> tags."
)
ACTION_ONLY = (
    "Choose an appropriate action for the current step and present it within <action> </action> tags."
)


def history_entries(history: list[tuple[str, str]], shown: int, step: int) -> str:
    """The history, numbered by step: every earlier action, then the last ``shown`` (observation, action) pairs
    whole; ``step`` steps were taken before this turn."""
    first, earlier = step - len(history) + 1, len(history) - shown
    return "\n".join(
        EARLIER_ENTRY.format(n=first + i, action=act)
        if i < earlier
        else HISTORY_ENTRY.format(n=first + i, observation=obs, action=act)
        for i, (obs, act) in enumerate(history)
    )


def actions_taken(history: list[tuple[str, str]]) -> str:
    """With ``actions_only``: the actions of ``history`` (the steps before this turn, oldest first: every one, unless
    the collector dropped the oldest to fit the prompt) without their observations."""
    return ACTIONS_TAKEN.format(count=len(history), actions="; ".join(action for _, action in history))


def check_layout(fixed_first: bool, action_list: str, actions_only: bool, history_length: int) -> None:
    """``action_list`` is one of :data:`ACTION_LISTS`; the reference's order has its own list only; ``actions_only``
    is the history at ``history_length`` 0 (above it the reference's history already lists the earlier actions)."""
    if action_list not in ACTION_LISTS:
        raise ConfigError(f"unknown ScienceWorld action_list {action_list!r}; valid: {', '.join(ACTION_LISTS)}")
    if not fixed_first and action_list != "full":
        raise ConfigError("env.prompt.action_list other than full needs env.prompt.fixed_first=true (the reference's "
                          "order keeps the reference's list)")
    if actions_only and history_length > 0:
        raise ConfigError(f"env.prompt.actions_only=true shows the earlier actions without their observations, but "
                          f"env.history_length={history_length} shows the last {history_length} with theirs: set "
                          "env.history_length=0, or drop env.prompt.actions_only")


def fixed_text(task: str, templates: list[str] | None, action_list: str = "full") -> str:
    """With ``fixed_first``: the text before a turn's history and observation, the same at every turn of an episode
    (its part up to the task, the same in every prompt). It ends on a word or a tag, not on the blank line that
    follows it: a byte-level BPE splits a run of newlines by what comes after it, so the fixed text's tokens are a
    prefix of every turn's only when the whitespace belongs to the turn's part."""
    listed = ACTION_LISTS[action_list]
    parts = [INTRO + ("\n" + listed if listed else ""), TASK.format(task=task)]
    if templates is not None:
        parts[-1] += "\n" + AVAILABLE_TEMPLATES.format(templates=templates)
    return "\n\n".join(parts)


def turn_text(task: str, situation: str, admissible_actions: list[str] | None, with_history: bool, think: bool,
              fixed_first: bool = False, action_list: str = "full") -> str:
    """The user message around ``situation`` (the observation, with or without history); ``admissible_actions`` are
    the task's action templates followed by the environment's objects line (lightning_epo/envs/sciworld.py)."""
    instruction = _instruction(with_history, think)
    if fixed_first:
        templates, objects = (None, None) if admissible_actions is None else (admissible_actions[:-1],
                                                                              admissible_actions[-1])
        fresh = situation + ("\n" + objects if objects is not None else "")
        return fixed_text(task, templates, action_list) + "\n\n" + fresh + "\n\n" + instruction
    parts = [INTRO + "\n" + TASK.format(task=task), situation + "\n" + ACTIONS]
    if admissible_actions is not None:
        *templates, objects = admissible_actions
        parts.append(AVAILABLE.format(templates=templates, objects=objects))
    return "\n\n".join([*parts, instruction])


def next_text(situation: str, admissible_actions: list[str] | None, think: bool) -> str:
    """With ``transcript``: the user message of a turn after the first, around ``situation`` (the observation): the
    objects present (the last entry of ``admissible_actions``; the task's templates stay in the first turn's text),
    then the instruction."""
    fresh = situation + ("\n" + admissible_actions[-1] if admissible_actions else "")
    return fresh + "\n\n" + _instruction(False, think)


def _instruction(with_history: bool, think: bool) -> str:
    """The reference's closing instruction (its history template runs the two sentences together when it reasons)."""
    return "Now it's your turn to take an action." + (" " if with_history and think else "\n") + (
        REASON if think else ACTION_ONLY)
