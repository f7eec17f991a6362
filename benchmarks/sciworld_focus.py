"""ScienceWorld's find tasks in runs' sampled training episodes: how each episode's first `focus on` went, and the
episodes' lengths and returns by how they ended.

    python benchmarks/sciworld_focus.py RUN_DIR [RUN_DIR ...] [--action "focus on door"]

Reads each run's ``samples.jsonl`` (the episodes the run sampled to its log: 2 a step in the SmolLM2 recipes) and
keeps the episodes of the find tasks (task text "find a(n) ..."): a wrong focus fails such a task at once, so a first
valid `focus on` that is the episode's last turn, in an episode neither won nor cut at the turn limit, was a wrong
object; any other first focus was right (the task went on). Counts the episodes whose first focus was right (and how
many of those were won), wrong, or that never focused, with each group's mean return; the episodes' mean length and
return when won, failed or cut; and how often ``--action`` was played in every turn of every sampled episode (by
default the prompt's example action, the reference's `focus on door`). docs/comparison_sciworld_token_mean.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

import bench_utils  # noqa: F401 - puts the repository on sys.path

from lightning_epo.reports.eval_episodes import episode_ending

FIND = "find a(n)"
FOCUS = "focus on"


def first_focus(episode: dict) -> str:
    """``right``, ``wrong`` or ``none``: how the episode's first valid `focus on` went (module docstring)."""
    turns = episode["turns"]
    focused = [i for i, turn in enumerate(turns) if (turn["action"] or "").startswith(FOCUS) and turn["action_valid"]]
    if not focused:
        return "none"
    ended_the_task = focused[0] == len(turns) - 1 and not episode["won"] and not episode["truncated"]
    return "wrong" if ended_the_task else "right"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories with a samples.jsonl")
    parser.add_argument("--action", default="focus on door", help="an action to count in every sampled turn")
    args = parser.parse_args()
    episodes = [json.loads(line) for run in args.runs for line in (run / "samples.jsonl").read_text().splitlines()]
    turns = [turn for episode in episodes for turn in episode["turns"]]
    print(f"{len(args.runs)} runs, {len(episodes)} sampled episodes, {len(turns)} turns; "
          f"'{args.action}' played in {sum(turn['action'] == args.action for turn in turns)}")
    find = [episode for episode in episodes if episode["task"].startswith(FIND)]
    for name, key in (("first focus", first_focus), ("ended", episode_ending)):
        groups = defaultdict(list)
        for episode in find:
            groups[key(episode)].append(episode)
        print(f"\n{len(find)} find episodes by {name}:")
        for group, members in sorted(groups.items()):
            won = sum(episode["won"] for episode in members)
            print(f"  {group}: {len(members)} ({won} won), mean turns "
                  f"{statistics.mean(len(e['turns']) for e in members):.1f}, mean return "
                  f"{statistics.mean(e['return'] for e in members):.2f}")


if __name__ == "__main__":
    main()
