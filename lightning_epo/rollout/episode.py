"""The episode record (DESIGN.md, "The episode record"): one training row per agent turn."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TurnSample:
    """One agent turn: the prompt the agent saw and the tokens it generated (token in, token out).

    ``reward`` is the turn's own reward (environment reward plus any invalid-action penalty);
    ``episode_return`` the sum of the turn rewards of its episode; ``won`` the episode's true success.
    ``action_valid`` is False when the turn pays the invalid-action penalty (a format error, or an action the simulator
    rejected); ``format_ok`` is the answer's format alone (an ``<action>`` pair, and ``format_valid``'s rules).
    ``response_truncated`` is True when the response hit the length limit. ``learned=False`` (a noisy
    expert's exploratory turn) keeps the turn in the episode but gives its row no response mask.
    The text fields are for logging samples only; training uses the token ids.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    traj_id: int
    turn_idx: int
    group_id: int
    reward: float = 0.0
    episode_return: float = 0.0
    won: bool = False
    response_truncated: bool = False
    learned: bool = True
    action_valid: bool = True
    format_ok: bool = True
    episode_truncated: bool = False
    response_logprobs: list[float] | None = None
    task: str = ""
    response_text: str = ""
    action: str | None = None
    observation: str = ""


@dataclass
class Episode:
    """All turns of one trajectory plus its summary.

    ``task`` is the environment's task text, ``task_name`` the suite's name of the task (``Task.name``: per-task
    metrics); ``score`` the environment's own score at the episode's end where it has one (ScienceWorld's 0-100,
    negative when the task failed), else None."""

    traj_id: int
    group_id: int
    task: str
    turns: list[TurnSample] = field(default_factory=list)
    won: bool = False
    episode_return: float = 0.0
    truncated: bool = False  # ended by the turn limit or an environment failure, not by the task
    task_name: str = ""
    score: float | None = None

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def invalid_actions(self) -> int:
        return sum(not t.action_valid for t in self.turns)

    @property
    def format_errors(self) -> int:
        return sum(not t.format_ok for t in self.turns)
