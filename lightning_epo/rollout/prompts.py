"""The paper's agent prompts (EPO, Appendix D) and the ``<action>`` parser.

ALFWorld (and the built-in gridworld) use verl-agent/GiGPO's ALFWorld prompt, as the EPO and RLVMR
code bases do for ALFWorld: a first-step template without history, and a template that shows the
task, the step count, the last ``history_length`` (observation, action) pairs, the current
observation and the admissible actions. Everything goes into one user message, as in verl-agent.

Each environment owns its text: its first sentence is ``PROMPT_INTRO`` of its module in ``lightning_epo/envs/``
(a new environment with this template needs nothing here), and ScienceWorld's whole prompt lives in
``lightning_epo/envs/sciworld_prompt.py``.

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
  (the reference numbers the one entry of the second turn "Step 0");
- ScienceWorld's sentences are ordered fixed text first by default (``env.prompt.fixed_first``: the intro and the
  action list, then the task and its templates, then the history, the observation and the objects present), so
  that every turn of an episode begins with the same tokens (the engine's prefix cache, the update's shared-prefix
  pass); ``fixed_first: false`` is the reference's order. ``env.prompt.action_list`` (``full``, the reference's;
  ``compact``; ``none``) is the 25-action list's form (lightning_epo/envs/sciworld_prompt.py);
- ScienceWorld's ``env.prompt.actions_only`` (with ``history_length`` 0): the history is every earlier action without
  its observation, in a sentence of its own (the reference shows no history at 0);
- ``env.prompt.transcript`` (with ``history_length`` 0; any environment): an episode is one chat. The first turn is
  the first-step prompt; every later turn's prompt is the previous turn's prompt and answer, token for token, then a
  user message with the new observation (and the objects present or the admissible actions) and the instruction
  (:meth:`PromptBuilder.next_text`). Each turn's row then begins the next one's (``model.fold_turns`` computes an
  episode once, the engine's prefix cache serves the earlier turns), and the agent sees every earlier observation
  and answer; the reference rebuilds one user message a turn with the last ``history_length`` pairs. A transcript
  that would pass ``model.max_prompt_tokens`` starts over from the turn's first-step prompt (the collector).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from typing import Any

from lightning_epo import envs
from lightning_epo.core.errors import ConfigError
from lightning_epo.envs import sciworld_prompt

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

_ACTION_RE = re.compile(r"<action>(.*?)</action>", re.DOTALL | re.IGNORECASE)
_THINK_TAGS = ("<think>", "</think>")
_CJK = re.compile(r"[\u4e00-\u9fff]")  # CJK Unified Ideographs, as in verl-agent's check

def prompt_envs() -> list[str]:
    """The environments with prompt text: the modules ``lightning_epo.envs.<name>`` that define ``PROMPT_INTRO``."""
    names = [module.name for module in pkgutil.iter_modules(envs.__path__)]
    return [name for name in names if hasattr(importlib.import_module(f"lightning_epo.envs.{name}"), "PROMPT_INTRO")]


def env_intro(env_name: str) -> str:
    """The environment's own first sentence of the prompt, ``PROMPT_INTRO`` of ``lightning_epo.envs.<env_name>``."""
    if env_name not in prompt_envs():
        raise ValueError(f"unknown env name {env_name!r} for prompts; valid: {', '.join(prompt_envs())}")
    return importlib.import_module(f"lightning_epo.envs.{env_name}").PROMPT_INTRO


def parse_action(text: str) -> str | None:
    """The content of the last ``<action>...</action>`` in ``text``, or None if there is none or it is blank.

    What counts follows the anchors' parser, verl-agent's ``alfworld_projection``
    (``agent_system/environments/env_package/alfworld/projection.py``, the same function in the EPO code base),
    which lowercases the response, then slices between ``find("<action>")`` and ``find("</action>")`` and strips:

    - the tags match in any case (``<Action>``, ``</ACTION>``) and whitespace around the action is stripped;
    - the action's own case is kept: the environments normalise commands themselves (gridworld and ALFWorld
      lowercase them, ScienceWorld matches its own vocabulary; verl-agent's ScienceWorld parser keeps case too);
    - an answer without the tags is no action, even when it is exactly one admissible action (SmolLM2-135M's
      zero-shot answers name actions inside sentences, "Go north and then take an action within ...": the
      paper's format is part of the task, and the invalid-action penalty is what teaches it).

    Departures from verl-agent:

    - the last tag pair counts, not the first: a model that echoes the instruction's empty pair ("choose an
      action within the <action> </action> tags") and then answers is read by its answer;
    - a blank pair, or a ``</action>`` found only before the ``<action>``, is no action (verl-agent's slice passes
      an empty action on as valid);
    - a response without any tag pair is no action and no environment step; verl-agent sends its last 30
      characters to the simulator as the action (which rejects them: nothing else happens).

    :func:`format_valid` holds verl-agent's other two rules (think tags, Chinese characters).
    """
    matches = _ACTION_RE.findall(text)
    if not matches:
        return None
    action = matches[-1].strip()
    return action or None


def format_valid(text: str, think: bool) -> bool:
    """verl-agent's two format rules besides the action tags (``alfworld_projection``, see :func:`parse_action`):
    with ``think`` (the prompt asks for reasoning) the response must hold both ``<think>`` and ``</think>``, and
    it must hold no Chinese character (``[\\u4e00-\\u9fff]``, language mixing of Qwen-style models).

    As in verl-agent, a response that breaks one of them still plays its parsed action, and its turn pays the
    invalid-action penalty (:class:`~lightning_epo.rollout.collector.EpisodeCollector`). Departure: the think tags
    match in any case, like the action tags (verl-agent looks for them in the original case).
    """
    if _CJK.search(text):
        return False
    lowered = text.lower()
    return not think or all(tag in lowered for tag in _THINK_TAGS)


class PromptBuilder:
    """Builds the agent's chat prompt for one turn of one environment family.

    ``history_length`` is how many past (observation, action) pairs the prompt shows (the paper: 2);
    with 0 every turn uses the first-step template. ``fixed_first``, ``action_list`` and ``actions_only``:
    ScienceWorld's layout (lightning_epo/envs/sciworld_prompt.py; the other environments have the reference's only).
    ``transcript``: an episode is one chat, each later turn a user message (:meth:`next_text`) after the previous
    turn's prompt and answer (:meth:`continued_ids`).
    """

    def __init__(self, env_name: str, history_length: int = 2, think: bool = True, fixed_first: bool = False,
                 action_list: str = "full", actions_only: bool = False, transcript: bool = False) -> None:
        self.intro = env_intro(env_name)
        if history_length < 0:
            raise ValueError(f"history_length must be >= 0, got {history_length}")
        if transcript and (history_length > 0 or actions_only):
            shown = "env.prompt.actions_only=true" if actions_only else f"env.history_length={history_length}"
            raise ConfigError(f"env.prompt.transcript=true keeps every earlier turn in the chat, which {shown} would "
                              f"show again: set env.history_length=0 without env.prompt.actions_only, or drop "
                              f"env.prompt.transcript")
        if env_name == "sciworld":
            sciworld_prompt.check_layout(fixed_first, action_list, actions_only, history_length)
        elif fixed_first or action_list != "full" or actions_only:
            raise ConfigError(f"env.prompt's fixed_first, action_list and actions_only are ScienceWorld's prompt "
                              f"settings, not {env_name}'s: drop them")
        self.env_name = env_name
        self.history_length = history_length
        self.think = think
        self.fixed_first = fixed_first
        self.action_list = action_list
        self.actions_only = actions_only
        self.transcript = transcript

    @property
    def history_needed(self) -> int | None:
        """How many past (observation, action) pairs :meth:`text` uses: ``history_length``, or every one
        (None) for ScienceWorld, whose prompt also lists all earlier actions (with ``actions_only``, only them).
        A transcript shows its earlier turns as they were played, not through :meth:`text`: 0."""
        lists_actions = self.env_name == "sciworld" and (self.history_length > 0 or self.actions_only)
        return None if lists_actions else self.history_length

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
        actions_only = self.actions_only and bool(history)
        if actions_only:  # the first-step sentence after the earlier actions
            situation = sciworld_prompt.actions_taken(history) + "\n" + situation
        if self.env_name == "sciworld":
            return sciworld_prompt.turn_text(task, situation, admissible_actions, bool(recent) or actions_only,
                                             self.think, self.fixed_first, self.action_list)
        return self._closed([self.intro, _TASK.format(task=task), situation], admissible_actions)

    def next_text(self, observation: str, admissible_actions: list[str] | None) -> str:
        """With ``transcript``: the user message of a turn after the first, what the turn adds to the chat: the
        observation, then the objects present (ScienceWorld: the task's templates stay in the first turn) or the
        admissible actions, then the instruction."""
        situation = _FIRST_STEP.format(observation=observation)
        if self.env_name == "sciworld":
            return sciworld_prompt.next_text(situation, admissible_actions, self.think)
        return self._closed([situation], admissible_actions)

    def _closed(self, parts: list[str], admissible_actions: list[str] | None) -> str:
        """The reference template's message: ``parts``, the admissible-actions sentence, then the instruction."""
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
        return sciworld_prompt.history_entries(history, len(recent), step)

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

    def continued_ids(self, tokenizer: Any, prompt_ids: list[int], response_ids: list[int], observation: str,
                      admissible_actions: list[str] | None) -> list[int]:
        """With ``transcript``: the prompt ids of the turn after the one played on ``prompt_ids`` with the answer
        ``response_ids``: those, the chat template's end of the assistant turn (left out where the answer already
        ends with it: its last token the tokenizer's eos token, with which ChatML templates end a turn), the user
        message (:meth:`next_text`) and the assistant generation prefix. Control tokens inside the message are
        encoded as plain text (:func:`chat_token_ids`)."""
        messages = [{"role": "user", "content": ""}, {"role": "assistant", "content": _ANSWER},
                    {"role": "user", "content": self.next_text(observation, admissible_actions)}]
        chat = _render_chat(tokenizer, messages)
        tail = chat[chat.index(_ANSWER) + len(_ANSWER):]
        if response_ids[-1:] == [tokenizer.eos_token_id] and tail.startswith(tokenizer.eos_token):
            tail = tail[len(tokenizer.eos_token):]
        return prompt_ids + response_ids + _encode_chat(tokenizer, tail)


# Private-use code points around a control token found in message text while the chat is rendered, and one that
# stands for an earlier answer (PromptBuilder.continued_ids).
_MARK_OPEN, _MARK_CLOSE, _ANSWER = "\ue000", "\ue001", "\ue002"
_MARKED = re.compile(f"{_MARK_OPEN}(.*?){_MARK_CLOSE}", re.DOTALL)


def chat_token_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of ``messages`` in the tokenizer's chat template, ending with the generation prefix.

    Control tokens (the tokenizer's added tokens, e.g. ``<|im_end|>``) written inside a message are encoded as
    plain text, so only the template itself can open or close a chat turn. (transformers 5.21 added this as
    ``apply_chat_template(..., sanitize_control_tokens=True)``; 5.19, the release vLLM accepts, ignores that
    argument.) Each such token is marked before rendering; the rendered chat is then encoded piece by piece:
    template text with its control tokens, marked tokens with added tokens switched off.
    """
    return _encode_chat(tokenizer, _render_chat(tokenizer, messages))


def _render_chat(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """``messages`` in the chat template, ending with the generation prefix, each control token inside a message
    marked (:func:`chat_token_ids`)."""
    control = sorted(tokenizer.added_tokens_encoder, key=len, reverse=True)
    found = re.compile("|".join(map(re.escape, control))) if control else None

    def mark(text: str) -> str:
        return found.sub(lambda m: f"{_MARK_OPEN}{m.group()}{_MARK_CLOSE}", text) if found else text

    marked = [{**m, "content": mark(m["content"])} for m in messages]
    return tokenizer.apply_chat_template(marked, add_generation_prompt=True, tokenize=False)


def _encode_chat(tokenizer: Any, chat: str) -> list[int]:
    """The token ids of a rendered ``chat`` (:func:`_render_chat`): template text with its control tokens, marked
    tokens with added tokens switched off."""
    pieces = _MARKED.split(chat)  # [template text, marked token, template text, ...]
    ids: list[int] = []
    for i, piece in enumerate(pieces):
        if piece:
            ids += tokenizer.encode(piece, add_special_tokens=False, split_special_tokens=i % 2 == 1)
    return [int(i) for i in ids]
