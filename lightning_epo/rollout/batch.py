"""Episodes -> padded tensors: one row per agent turn (prompt + response), right-padded."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from lightning_epo.algos.advantages import AdvantageInputs
from lightning_epo.rollout.episode import Episode, TurnSample


@dataclass
class RolloutBatch:
    """One RL step's training rows.

    input_ids, attention_mask, response_mask: ``[N, L]`` (response_mask is 1 only on generated tokens);
    traj_ids, turn_idx, group_ids: ``[N]`` long; turn_rewards, episode_returns: ``[N]`` float;
    state_ids: ``[N]`` long, the same for rows of one group played from the same observation (GiGPO's anchors);
    sampler_logprobs: ``[N, L]`` float, the engine's log-prob of each response token at the token's position (0
    elsewhere), None where the turns carry none (the expert's);
    ``stats``: rollout metrics (``train/*``, ``perf/*``) already reduced to floats for this rank.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    traj_ids: torch.Tensor
    turn_idx: torch.Tensor
    group_ids: torch.Tensor
    turn_rewards: torch.Tensor
    episode_returns: torch.Tensor
    state_ids: torch.Tensor
    sampler_logprobs: torch.Tensor | None = None
    stats: dict[str, float] = field(default_factory=dict)
    episodes: list[Episode] = field(default_factory=list)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device: torch.device | str) -> "RolloutBatch":
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in moved.items():
            if isinstance(value, torch.Tensor):
                moved[name] = value.to(device)
        return RolloutBatch(**moved)

    def select(self, rows: torch.Tensor) -> "RolloutBatch":
        """The rows ``rows`` (an index tensor), trimmed to their longest sequence."""
        length = int(self.attention_mask[rows].sum(-1).max()) if len(rows) else 0
        picked = {
            f.name: getattr(self, f.name)[rows] for f in fields(self) if isinstance(getattr(self, f.name), torch.Tensor)
        }
        for name in ("input_ids", "attention_mask", "response_mask", "sampler_logprobs"):
            if name in picked:
                picked[name] = picked[name][:, :length]
        return RolloutBatch(**picked)

    def advantage_inputs(self, values: torch.Tensor | None = None) -> AdvantageInputs:
        """The batch as the advantage estimators see it, with the old critic's ``values`` ``[N, L]`` (PPO)."""
        return AdvantageInputs(
            mask=self.response_mask, turn_rewards=self.turn_rewards, episode_returns=self.episode_returns,
            traj_ids=self.traj_ids, turn_idx=self.turn_idx, group_ids=self.group_ids, values=values,
            state_ids=self.state_ids,
        )

    def split_by_tokens(self, rows: torch.Tensor, budget: int, prefix: int = 0) -> list[torch.Tensor]:
        """``rows`` (indices ``[n]``) sorted longest first and cut into consecutive micro-batches whose padded
        size after :meth:`select`'s trim is at most ``budget`` tokens (a row longer than ``budget`` forms a
        micro-batch of its own). The size is rows x their longest row, or, where the rows' first ``prefix`` tokens
        are alike and computed once (``model.shared_prefix``), ``prefix + rows x (longest - prefix)``
        (``Sharing.decoder_positions``, models/shared_prefix.py). Sorting puts rows of similar length together, so
        little of each micro-batch is padding. Returns index tensors that together hold every row of ``rows`` once."""
        lengths = self.attention_mask[rows].sum(-1)
        order = lengths.argsort(descending=True, stable=True)
        longest_first = lengths[order].tolist()
        cuts, start = [], 0
        for i in range(1, len(order)):
            if prefix + (i - start + 1) * (longest_first[start] - prefix) > budget:  # row i would not fit beside
                cuts.append(rows[order[start:i]])                                     # rows start..i-1
                start = i
        return [*cuts, rows[order[start:]]]


def collate_episodes(episodes: list[Episode], pad_token_id: int, stats: dict[str, float] | None = None) -> RolloutBatch:
    """Stack every turn of ``episodes`` into a right-padded :class:`RolloutBatch` (token in, token out:
    the rows hold exactly the engine's ids, and its log-probs where every turn has them). A turn with
    ``learned=False`` keeps its row, with no response mask."""
    turns = [t for ep in episodes for t in ep.turns]
    if not turns:
        raise ValueError("the rollout produced no agent turns: check env.max_turns and the task split")
    length = max(len(t.prompt_ids) + len(t.response_ids) for t in turns)
    input_ids = torch.full((len(turns), length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(turns), length), dtype=torch.long)
    response_mask = torch.zeros((len(turns), length), dtype=torch.bool)
    scored = all(t.response_logprobs is not None for t in turns)
    sampler_logprobs = torch.zeros((len(turns), length)) if scored else None
    for row, t in enumerate(turns):
        p, r = len(t.prompt_ids), len(t.response_ids)
        input_ids[row, : p + r] = torch.tensor(t.prompt_ids + t.response_ids, dtype=torch.long)
        attention_mask[row, : p + r] = 1
        response_mask[row, p : p + r] = t.learned
        if scored:
            sampler_logprobs[row, p : p + r] = torch.tensor(t.response_logprobs)
    return RolloutBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_mask=response_mask,
        traj_ids=torch.tensor([t.traj_id for t in turns], dtype=torch.long),
        turn_idx=torch.tensor([t.turn_idx for t in turns], dtype=torch.long),
        group_ids=torch.tensor([t.group_id for t in turns], dtype=torch.long),
        turn_rewards=torch.tensor([t.reward for t in turns], dtype=torch.float32),
        episode_returns=torch.tensor([t.episode_return for t in turns], dtype=torch.float32),
        state_ids=anchor_state_ids(turns),
        sampler_logprobs=sampler_logprobs,
        stats=dict(stats or {}),
        episodes=episodes,
    )


def anchor_state_ids(turns: list[TurnSample]) -> torch.Tensor:
    """``[N]`` ids numbering the distinct (group, observation the turn was played from) pairs in order of
    first appearance: GiGPO's anchor states, exact text matches within a group of rollouts of one task."""
    ids: dict[tuple[int, str], int] = {}
    return torch.tensor([ids.setdefault((t.group_id, t.observation), len(ids)) for t in turns], dtype=torch.long)
