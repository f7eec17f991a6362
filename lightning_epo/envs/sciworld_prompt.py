"""ScienceWorld's own prompt text: the EPO code base's ScienceWorld prompt (WujiangXu/EPO,
``agent_system/environments/prompts/sciworld.py``, with the available-actions text its environment wrapper writes),
filled in by :class:`lightning_epo.rollout.prompts.PromptBuilder` (whose docstring lists the departures)."""

from __future__ import annotations

import json

INTRO = (
    "You are an expert agent operating in the ScienceWorld environment, which is a text-based "
    "virtual environment centered around accomplishing tasks from the elementary science curriculum."
)
TASK = "Your current task is: {task}"
HISTORY_ENTRY = "[Step {n}, Observation {n}: '{observation}', Action {n}: '{action}']"
EARLIER_ENTRY = "[Step {n}, Action {n}: '{action}']"
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
# The environment lists the task's templates, then the objects line (lightning_epo/envs/sciworld.py).
AVAILABLE = (
    "Current available actions:\nValid_actions: {templates}, {objects}\n example: <action>focus on door</action>"
)
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


def turn_text(task: str, situation: str, admissible_actions: list[str] | None, with_history: bool, think: bool) -> str:
    """The user message around ``situation`` (the observation, with or without history); ``admissible_actions`` are
    the task's action templates followed by the environment's objects line (lightning_epo/envs/sciworld.py)."""
    parts = [INTRO + "\n" + TASK.format(task=task), situation + "\n" + ACTIONS]
    if admissible_actions is not None:
        *templates, objects = admissible_actions
        parts.append(AVAILABLE.format(templates=templates, objects=objects))
    turn = "Now it's your turn to take an action." + (" " if with_history and think else "\n")
    return "\n\n".join([*parts, turn + (REASON if think else ACTION_ONLY)])
