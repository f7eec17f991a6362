"""Play the environment's own expert (``rollout=expert``): a sanity check of envs, prompts and parsing.

The expert's response is the text ``<action>{expert_action}</action>`` (after an empty
``<think></think>`` when ``think=True``), encoded once and closed with the tokenizer's eos token,
exactly the shape the paper's prompt asks the policy for. Its log-probs are 0.0; nothing here is
sampled from a model.

``explore_prob > 0`` makes it a noisy expert (DART, Laskey et al. 2017): each turn, with that probability,
it answers with an action drawn uniformly from ``explore_actions`` (e.g. the four moves, walls included)
instead of the expert's, so a warm start on its episodes also sees off-path states ("Nothing happens.")
followed by the expert's recovery. The exploratory turns are played but not learned from
(``Generation.learned=False``: no response mask), so the warm start imitates only the expert's answers.
Draws use Python's ``random``, reseeded at every RL step.
"""

from __future__ import annotations

import random
from typing import Any, Sequence

from lightning_epo.core.errors import ConfigError
from lightning_epo.rollout.engine import Generation, GenerationEngine, SamplingParams


class ExpertEngine(GenerationEngine):
    """Answers every prompt with the environment's next expert action (``info["expert_action"]``)."""

    def __init__(
        self, tokenizer: Any, think: bool = False, explore_prob: float = 0.0, explore_actions: Sequence[str] = ()
    ) -> None:
        if tokenizer.eos_token_id is None:
            raise ValueError("ExpertEngine needs a tokenizer with an eos token to close the expert's turn")
        if not 0.0 <= explore_prob <= 1.0:
            raise ConfigError(f"rollout.engine.explore_prob must be in [0, 1], got {explore_prob}")
        if explore_prob > 0 and not explore_actions:
            raise ConfigError("rollout.engine.explore_prob > 0 needs rollout.engine.explore_actions (e.g. the env's moves)")
        self.tokenizer = tokenizer
        self.think = think
        self.explore_prob = explore_prob
        self.explore_actions = list(explore_actions)

    def response_text(self, expert_action: str) -> str:
        """The response text for one expert action (without the eos token)."""
        prefix = "<think></think>" if self.think else ""
        return f"{prefix}<action>{expert_action}</action>"

    def generate(
        self, prompts: list[list[int]], sampling: SamplingParams, infos: list[dict[str, Any]] | None = None
    ) -> list[Generation]:
        """One expert response per prompt; ``sampling`` is ignored, ``infos[i]`` must hold ``expert_action``."""
        if infos is None or len(infos) != len(prompts):
            raise ValueError("rollout=expert needs one env info dict per prompt (the collector passes them)")
        generations = []
        for info in infos:
            action = info.get("expert_action")
            if not action:
                raise ValueError(
                    "rollout=expert: the environment gave no info['expert_action'] for task "
                    f"{info.get('task', '?')!r}; "
                    "use an env whose info carries its expert's next action, or rollout=hf"
                )
            explored = self.explore_prob > 0 and random.random() < self.explore_prob
            if explored:
                action = random.choice(self.explore_actions)
            ids = self.tokenizer.encode(self.response_text(action), add_special_tokens=False)
            ids.append(int(self.tokenizer.eos_token_id))
            generations.append(Generation(ids, None, "stop", learned=not explored))
        return generations
