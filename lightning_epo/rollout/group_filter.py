"""Dynamic sampling (DAPO, Yu et al. 2025, Sec. 3.2): train on the groups whose rollouts disagree.

A group whose rollouts all win or all fail has zero group-relative advantage (GRPO, GiGPO's episode
term) and, for a near-deterministic policy, is most of a batch. ``data.oversample = m`` collects ``m``
times the step's groups and keeps ``groups_per_step`` of them, groups with mixed outcomes first. DAPO
keeps sampling until the batch is full of such groups; here the collection is one wave of fixed size
(the step's cost is bounded and the batch shape fixed), and when too few groups disagree the batch is
filled up with the others, in the order they were drawn.
"""

from __future__ import annotations

from lightning_epo.rollout.episode import Episode


def groups_in_order(episodes: list[Episode]) -> dict[int, list[Episode]]:
    """Episodes by ``group_id``, groups in order of first appearance."""
    groups: dict[int, list[Episode]] = {}
    for ep in episodes:
        groups.setdefault(ep.group_id, []).append(ep)
    return groups


def is_mixed(group: list[Episode]) -> bool:
    """Whether the group's rollouts differ in success (DAPO's accuracy criterion)."""
    return len({ep.won for ep in group}) > 1


def mixed_share(episodes: list[Episode]) -> float:
    """The share of the episodes' groups whose rollouts mix wins and losses (``train/mixed_groups``): the groups
    that give a group-relative advantage a success signal."""
    groups = groups_in_order(episodes).values()
    return sum(is_mixed(g) for g in groups) / max(len(groups), 1)


def keep_mixed_groups(episodes: list[Episode], groups_wanted: int) -> list[Episode]:
    """The episodes of ``groups_wanted`` groups, mixed-outcome groups first, then the others, each in draw
    order (fewer groups than wanted: all of them)."""
    ranked = sorted(groups_in_order(episodes).values(), key=lambda g: not is_mixed(g))  # stable: draw order
    return [ep for group in ranked[:groups_wanted] for ep in group]
