"""Episodes -> training rows: GiGPO's anchor states."""

from __future__ import annotations

from lightning_epo.rollout.batch import collate_episodes
from lightning_epo.rollout.episode import Episode, TurnSample


def episode(traj_id: int, group_id: int, observations: list[str]) -> Episode:
    ep = Episode(traj_id=traj_id, group_id=group_id, task="t")
    for t, obs in enumerate(observations):
        ep.turns.append(TurnSample([5, 6], [7], traj_id, t, group_id, observation=obs))
    return ep


def test_anchor_states_are_shared_observations_within_a_group_only():
    episodes = [
        episode(0, 0, ["start", "a", "b"]),
        episode(1, 0, ["start", "b", "b"]),  # "b" again: the same state as traj 0's third turn
        episode(2, 1, ["start", "a"]),  # group 1: the same texts are other states
    ]
    batch = collate_episodes(episodes, pad_token_id=0)
    assert batch.state_ids.tolist() == [0, 1, 2, 0, 2, 2, 3, 4]
