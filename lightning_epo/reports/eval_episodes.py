"""A run's evaluation episodes back from ``RUN_DIR/eval_episodes.jsonl`` (lightning_epo/callbacks/eval_episodes.py),
and two runs' episodes of one seed paired per task."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lightning_epo.core import layout
from lightning_epo.core.errors import UserError
from lightning_epo.reports.paired import Pair

Outcomes = dict[int, tuple[str, bool]]  # place in the validation sample: (task, won)
Episodes = dict[int, dict[str, Any]]  # place in the validation sample: the episode's line (callbacks/eval_episodes.py)


def final_episodes(run_dir: Path, split: str, mode: str = "train") -> Episodes | None:
    """The episodes of the run's last evaluation of ``split`` in ``mode`` (``train``: the largest ``after_rl_steps``
    of its training's evaluations; ``eval``: a ``mode=eval`` run's; of an evaluation played twice, the last line of
    each place); None when the run recorded none (no file: a run from before the record, or one whose callback was
    dropped)."""
    path = Path(run_dir) / layout.EVAL_EPISODES
    if not path.is_file():
        return None
    by_step: dict[int, Episodes] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise UserError(f"{path}:{number} is not JSON (a run stopped while writing it?): remove the line") from None
        if row["mode"] == mode and row["split"] == split:
            by_step.setdefault(row["after_rl_steps"], {})[row["place"]] = row
    return by_step[max(by_step)] if by_step else None


def final_outcomes(run_dir: Path, split: str, mode: str = "train") -> Outcomes | None:
    """``(task, won)`` of each episode of :func:`final_episodes`; None when the run recorded none."""
    episodes = final_episodes(run_dir, split, mode)
    return None if episodes is None else {place: (row["task"], row["won"]) for place, row in episodes.items()}


def episode_ending(row: dict[str, Any]) -> str:
    """How an episode ended: ``won``; ``cut`` at the turn limit without a win (``truncated``: stopped at
    ``env.max_turns``, or by an environment failure, before the task ended); or ``failed`` (the task ended without a
    win)."""
    return "won" if row["won"] else "cut" if row["truncated"] else "failed"


def unwon_share(episodes: Episodes, cut: bool, within: int | None = None) -> float:
    """The share of ``episodes`` that ended without a win: by a failure (``cut=False``: not cut at the turn limit,
    ``truncated``) or cut at the turn limit (``cut=True``: where the episodes of a policy that fails less went when it
    does not win more, docs/comparison_sciworld_warm_paths_rl.md); with ``within``, only those that ended so in at
    most ``within`` turns (ScienceWorld's failing fast)."""
    ending = "cut" if cut else "failed"
    ended = [row for row in episodes.values()
             if episode_ending(row) == ending and (within is None or row["turns"] <= within)]
    return len(ended) / len(episodes)


def pair_outcomes(arm: Outcomes, other: Outcomes, what: str) -> list[Pair]:
    """``(arm won, other won)`` per place, in place order; one error line (naming ``what``) when the two did not play
    the same tasks at the same places: the runs are not paired."""
    if arm.keys() != other.keys() or any(arm[p][0] != other[p][0] for p in arm):
        differ = sorted(arm.keys() ^ other.keys()) or [p for p in sorted(arm) if arm[p][0] != other[p][0]]
        raise UserError(f"{what}: the two runs' final evaluations did not play the same tasks (places {differ[:5]} "
                        "differ): a paired comparison needs the same seed, env and env.val_size in both")
    return [(arm[p][1], other[p][1]) for p in sorted(arm)]
