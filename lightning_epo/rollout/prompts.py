"""The paper's agent prompts (EPO, Appendix D) and the ``<action>`` parser.

ALFWorld (and the built-in gridworld) use verl-agent/GiGPO's ALFWorld prompt, as the EPO and RLVMR
code bases do for ALFWorld: a first-step template without history, and a template that shows the
task, the step count, the last ``history_length`` (observation, action) pairs, the current
observation and the admissible actions. Everything goes into one user message, as in verl-agent.

ScienceWorld uses the EPO code base's own ScienceWorld prompt (WujiangXu/EPO,
``agent_system/environments/prompts/sciworld.py``, with the available-actions text its environment
wrapper writes): "Your current task is: ...", the history, the current observation, ScienceWorld's 25
action templates with their descriptions ("Here are the actions you may take:") and "Current available
actions:" (the loaded task's action templates and the objects present, as the environment lists them).
Its history lists every earlier action as well as the last ``history_length`` (observation, action) pairs.

Departures from the reference prompts:

- the ALFWorld first-step template names the task (verl-agent's ALFWorld relies on the task sentence
  inside the first observation; newer verl-agent versions name it too), and so does gridworld's;
- the "observaitons" typo of the ALFWorld reference is fixed, and spaces at the end of a line are dropped;
- ``think=False`` asks for the ``<action>`` tag only (short responses for the tiny CPU model);
- the admissible-actions sentence (ScienceWorld: the "Current available actions" part) is left out when
  an environment has no list (``None``);
- ScienceWorld's task is the description without its leading "Your task is to " (the reference reads
  "Your current task is: Your task is to ..."), and its history entries carry their own step numbers
  (the reference numbers the one entry of the second turn "Step 0").
"""

from __future__ import annotations

import json
import re
from typing import Any

_INTROS = {
    "gridworld": "You are an expert agent operating in the GridWorld environment, a text-based grid "
    "in which you walk to the goal object one step at a time and then use it.",
    "sciworld": "You are an expert agent operating in the ScienceWorld environment, which is a text-based "
    "virtual environment centered around accomplishing tasks from the elementary science curriculum.",
    "alfworld": "You are an expert agent operating in the ALFRED Embodied Environment.",
}

_TASK = "Your task is to: {task}"
_FIRST_STEP = "Your current observation is: {observation}"
_HISTORY = (
    "Prior to this step, you have already taken {step_count} step(s). Below are the most recent "
    "{history_length} observations and the corresponding actions you took: {history}\n"
    "You are now at step {current_step} and your current observation is: {observation}"
)
_ADMISSIBLE = "Your admissible actions of the current situation are: [{admissible_actions}]."
_HISTORY_ENTRY = "[Observation {n}: '{observation}', Action {n}: '{action}']"

_INSTRUCTION_THINK = (
    "Now it's your turn to take an action.\n"
    "You should first reason step-by-step about the current situation. This reasoning process MUST be "
    "enclosed within <think> </think> tags.\n"
    "Once you've finished your reasoning, you should choose an admissible action for current step and "
    "present it within <action> </action> tags."
)
_INSTRUCTION_ACTION_ONLY = (
    "Now it's your turn to take an action.\n"
    "Choose an admissible action for current step and present it within <action> </action> tags."
)

# ScienceWorld (the EPO code base's sciworld.py): the action templates with their descriptions are fixed text.
_SCIWORLD_TASK = "Your current task is: {task}"
_SCIWORLD_HISTORY_ENTRY = "[Step {n}, Observation {n}: '{observation}', Action {n}: '{action}']"
_SCIWORLD_EARLIER_ENTRY = "[Step {n}, Action {n}: '{action}']"
_SCIWORLD_ACTION_DESCRIPTIONS = (
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
_SCIWORLD_ACTIONS = "Here are the actions you may take:\n[\n{}\n]".format(
    ",\n".join(json.dumps({"action": a, "description": d}) for a, d in _SCIWORLD_ACTION_DESCRIPTIONS)
)
# The environment lists the task's templates, then the objects line (lightning_epo/envs/sciworld.py).
_SCIWORLD_AVAILABLE = (
    "Current available actions:\nValid_actions: {templates}, {objects}\n example: <action>focus on door</action>"
)
_SCIWORLD_REASON = (
    "You should first reason step-by-step about the current situation. This reasoning process MUST be enclosed "
    "within <think> </think> tags.\nOnce you've finished your reasoning, you should choose an appropriate action "
    "for the current step and present it within <action> </action> tags."
)
_SCIWORLD_ACTION_ONLY = (
    "Choose an appropriate action for the current step and present it within <action> </action> tags."
)

_ACTION_RE = re.compile(r"<action>(.*?)</action>", re.DOTALL)

ENV_NAMES = tuple(_INTROS)


def parse_action(text: str) -> str | None:
    """The content of the last ``<action>...</action>`` in ``text``, or None if there is none or it is blank.

    Only surrounding whitespace is stripped; case is kept, because the simulators match commands
    themselves (ALFWorld and ScienceWorld both lowercase their own vocabularies).
    """
    matches = _ACTION_RE.findall(text)
    if not matches:
        return None
    action = matches[-1].strip()
    return action or None


class PromptBuilder:
    """Builds the agent's chat prompt for one turn of one environment family.

    ``history_length`` is how many past (observation, action) pairs the prompt shows (the paper: 2);
    with 0 every turn uses the first-step template.
    """

    def __init__(self, env_name: str, history_length: int = 2, think: bool = True) -> None:
        if env_name not in _INTROS:
            raise ValueError(f"unknown env name {env_name!r} for prompts; valid: {', '.join(ENV_NAMES)}")
        if history_length < 0:
            raise ValueError(f"history_length must be >= 0, got {history_length}")
        self.env_name = env_name
        self.history_length = history_length
        self.think = think

    @property
    def history_needed(self) -> int | None:
        """How many past (observation, action) pairs :meth:`text` uses: ``history_length``, or every one
        (None) for ScienceWorld, whose prompt also lists all earlier actions."""
        return None if self.env_name == "sciworld" and self.history_length > 0 else self.history_length

    def text(
        self,
        task: str,
        observation: str,
        admissible_actions: list[str] | None,
        history: list[tuple[str, str]],
        step: int,
    ) -> str:
        """The user message for one turn.

        ``history`` holds the (observation, action) pairs of the last ``len(history)`` steps, oldest first (the
        last ``history_length`` are shown; ScienceWorld also lists the earlier ones' actions); ``step`` is the
        number of steps already taken (0 at the first turn).
        """
        if len(history) > step:
            raise ValueError(f"history has {len(history)} entries but only {step} step(s) were taken")
        recent = history[-self.history_length :] if self.history_length > 0 else []
        if recent:
            situation = _HISTORY.format(
                step_count=step,
                history_length=len(recent),
                history=self._history_entries(history, recent, step),
                current_step=step + 1,
                observation=observation,
            )
        else:
            situation = _FIRST_STEP.format(observation=observation)
        if self.env_name == "sciworld":
            return self._sciworld_text(task, situation, admissible_actions, bool(recent))
        parts = [_INTROS[self.env_name], _TASK.format(task=task), situation]
        if admissible_actions is not None:
            parts.append(_ADMISSIBLE.format(admissible_actions="\n ".join(f"'{a}'" for a in admissible_actions)))
        return "\n".join(parts) + "\n\n" + (_INSTRUCTION_THINK if self.think else _INSTRUCTION_ACTION_ONLY)

    def _history_entries(self, history: list[tuple[str, str]], recent: list[tuple[str, str]], step: int) -> str:
        """The history shown, numbered by step: the ``recent`` pairs, after ScienceWorld's earlier actions."""
        if self.env_name != "sciworld":
            first = step - len(recent) + 1
            return "\n".join(
                _HISTORY_ENTRY.format(n=first + i, observation=obs, action=act) for i, (obs, act) in enumerate(recent)
            )
        first, earlier = step - len(history) + 1, len(history) - len(recent)
        return "\n".join(
            _SCIWORLD_EARLIER_ENTRY.format(n=first + i, action=act)
            if i < earlier
            else _SCIWORLD_HISTORY_ENTRY.format(n=first + i, observation=obs, action=act)
            for i, (obs, act) in enumerate(history)
        )

    def _sciworld_text(self, task: str, situation: str, admissible_actions: list[str] | None, with_history: bool) -> str:
        """The EPO code base's ScienceWorld prompt around ``situation`` (observation, with or without history);
        ``admissible_actions`` are the task's action templates followed by the environment's objects line."""
        parts = [_INTROS["sciworld"] + "\n" + _SCIWORLD_TASK.format(task=task), situation + "\n" + _SCIWORLD_ACTIONS]
        if admissible_actions is not None:
            *templates, objects = admissible_actions
            parts.append(_SCIWORLD_AVAILABLE.format(templates=templates, objects=objects))
        turn = "Now it's your turn to take an action." + (" " if with_history and self.think else "\n")
        return "\n\n".join([*parts, turn + (_SCIWORLD_REASON if self.think else _SCIWORLD_ACTION_ONLY)])

    @staticmethod
    def messages(text: str) -> list[dict[str, str]]:
        """The chat messages for one turn: a single user message holding the turn's :meth:`text`."""
        return [{"role": "user", "content": text}]

    def token_ids(self, tokenizer: Any, text: str) -> list[int]:
        """The token ids of the turn whose user message is ``text`` (:meth:`text`), ending with the assistant
        generation prefix of the chat template.

        Control tokens inside environment or agent text (e.g. a literal ``<|im_end|>``) are encoded as
        plain text, so only the template itself can open or close a chat turn.
        """
        return chat_token_ids(tokenizer, self.messages(text))


# Private-use code points around a control token found in message text while the chat is rendered.
_MARK_OPEN, _MARK_CLOSE = "\ue000", "\ue001"
_MARKED = re.compile(f"{_MARK_OPEN}(.*?){_MARK_CLOSE}", re.DOTALL)


def chat_token_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of ``messages`` in the tokenizer's chat template, ending with the generation prefix.

    Control tokens (the tokenizer's added tokens, e.g. ``<|im_end|>``) written inside a message are encoded as
    plain text, so only the template itself can open or close a chat turn. (transformers 5.21 added this as
    ``apply_chat_template(..., sanitize_control_tokens=True)``; 5.19, the release vLLM accepts, ignores that
    argument.) Each such token is marked before rendering; the rendered chat is then encoded piece by piece:
    template text with its control tokens, marked tokens with added tokens switched off.
    """
    control = sorted(tokenizer.added_tokens_encoder, key=len, reverse=True)
    found = re.compile("|".join(map(re.escape, control))) if control else None

    def mark(text: str) -> str:
        return found.sub(lambda m: f"{_MARK_OPEN}{m.group()}{_MARK_CLOSE}", text) if found else text

    marked = [{**m, "content": mark(m["content"])} for m in messages]
    chat = tokenizer.apply_chat_template(marked, add_generation_prompt=True, tokenize=False)
    pieces = _MARKED.split(chat)  # [template text, marked token, template text, ...]
    ids: list[int] = []
    for i, piece in enumerate(pieces):
        if piece:
            ids += tokenizer.encode(piece, add_special_tokens=False, split_special_tokens=i % 2 == 1)
    return [int(i) for i in ids]
