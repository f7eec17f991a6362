"""Episodes -> training rows: GiGPO's anchor states, the engine's log-probs at their tokens."""

from __future__ import annotations

import torch

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


def test_the_engines_log_probs_sit_at_their_response_tokens():
    """``sampler_logprobs [N, L]``: each turn's engine log-probs at the positions of the tokens they scored (a row is
    prompt then response), 0 elsewhere; the batch has none where an engine gave none (the expert)."""
    ep = Episode(traj_id=0, group_id=0, task="t")
    ep.turns.append(TurnSample([5, 6], [7, 8], 0, 0, 0, response_logprobs=[-0.5, -1.5]))
    ep.turns.append(TurnSample([9], [4], 0, 1, 0, response_logprobs=[-2.0]))
    batch = collate_episodes([ep], pad_token_id=0)
    assert batch.sampler_logprobs.tolist() == [[0.0, 0.0, -0.5, -1.5], [0.0, -2.0, 0.0, 0.0]]
    assert batch.select(torch.tensor([1])).sampler_logprobs.tolist() == [[0.0, -2.0]]  # trimmed as its row

    expert = episode(0, 0, ["start", "a"])  # turns without log-probs
    assert collate_episodes([expert], pad_token_id=0).sampler_logprobs is None
