"""ScienceWorld's prompt layouts (``env.prompt``: lightning_epo/envs/sciworld_prompt.py): fixed text first keeps the
reference's sentences, and every turn of an episode begins with the same tokens, which are the tokens the rows
hold (token in, token out); with the real simulator where ScienceWorld and Java are installed."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

from lightning_epo.core.errors import ConfigError
from lightning_epo.envs import sciworld_prompt
from lightning_epo.rollout.engine import SamplingParams
from lightning_epo.rollout.expert_engine import ExpertEngine
from lightning_epo.rollout.prompts import PromptBuilder

SMOLLM2 = Path(__file__).resolve().parents[2] / "data" / "smollm2-135m-instruct"
ACTIONS = ["open OBJ", "go to LOC", "OBJ needs to be replaced with one of the following objects: ['air', 'door']"]
HAS_SIMULATOR = importlib.util.find_spec("scienceworld") is not None and (
    shutil.which("java") is not None or bool(os.environ.get("JAVA_HOME")))


def _reference(**kwargs) -> str:
    return PromptBuilder("sciworld", think=False, **kwargs).text("boil water", "This room is the kitchen.", ACTIONS,
                                                                 [], 0)


def test_fixed_first_holds_the_reference_sentences_fixed_text_first():
    reference, fixed = _reference(), _reference(fixed_first=True)
    assert fixed == (
        sciworld_prompt.INTRO + "\n" + sciworld_prompt.ACTIONS + "\n\n"
        "Your current task is: boil water\n"
        "Current available actions:\nValid_actions: ['open OBJ', 'go to LOC']\n example: <action>focus on door</action>"
        "\n\nYour current observation is: This room is the kitchen.\n"
        "OBJ needs to be replaced with one of the following objects: ['air', 'door']\n\n"
        "Now it's your turn to take an action.\n"
        "Choose an appropriate action for the current step and present it within <action> </action> tags."
    )
    # the same words: the reference's available-actions line is split into the templates and the objects
    words = sorted(reference.replace("], OBJ", "]\nOBJ").split())
    assert sorted(fixed.split()) == words


def test_the_action_list_is_the_full_list_a_compact_one_or_none():
    full, compact, none = (_reference(fixed_first=True, action_list=a) for a in ("full", "compact", "none"))
    assert '{"action": "focus on OBJ", "description": "signal intent on a task object"}' in full
    assert "\nfocus on OBJ: signal intent on a task object\n" in compact and '{"action"' not in compact
    assert "Here are the actions you may take" not in none and "Valid_actions: ['open OBJ', 'go to LOC']" in none
    assert len(none) < len(compact) < len(full)


def test_a_layout_other_than_the_references_is_refused_where_it_cannot_apply():
    with pytest.raises(ValueError, match="valid: full, compact, none"):
        PromptBuilder("sciworld", fixed_first=True, action_list="short")
    with pytest.raises(ValueError, match="needs env.prompt.fixed_first=true"):
        PromptBuilder("sciworld", action_list="none")
    with pytest.raises(ValueError, match="ScienceWorld's prompt settings, not gridworld's"):
        PromptBuilder("gridworld", fixed_first=True)


def test_actions_only_lists_every_earlier_action_without_its_observation():
    builder = PromptBuilder("sciworld", history_length=0, think=False, fixed_first=True, action_list="none",
                            actions_only=True)
    history = [("You are in the hallway.", "go to kitchen"), ("A cat is here.", "focus on cat"),
               ("Taken.", "pick up cat")]
    text = builder.text("find a(n) animal", "You are in the kitchen.", ACTIONS, history, 5)
    situation = ("Your last 3 action(s): go to kitchen; focus on cat; pick up cat\n"
                 "Your current observation is: You are in the kitchen.")
    assert situation in text
    assert not any(observation in text for observation, _ in history)
    assert builder.history_needed is None  # the collector keeps every pair, as for the reference's history
    plain = PromptBuilder("sciworld", history_length=0, think=False, fixed_first=True, action_list="none")
    assert plain.history_needed == 0 and "go to kitchen" not in plain.text("find a(n) animal", "x", ACTIONS, history, 5)
    first_turn = builder.text("find a(n) animal", "You are in the hallway.", ACTIONS, [], 0)
    assert first_turn == plain.text("find a(n) animal", "You are in the hallway.", ACTIONS, [], 0)


def test_actions_only_is_refused_where_the_history_shows_observations_or_the_env_is_not_sciworld():
    with pytest.raises(ConfigError, match="history_length=2 shows the last 2 with theirs: set env.history_length=0"):
        PromptBuilder("sciworld", history_length=2, fixed_first=True, actions_only=True)
    with pytest.raises(ConfigError, match="ScienceWorld's prompt settings, not alfworld's"):
        PromptBuilder("alfworld", history_length=0, actions_only=True)


def test_the_env_config_sets_the_layout_the_collector_builds(compose_cfg):
    cfg = compose_cfg("env=sciworld")
    assert (cfg.data.collector.prompt.fixed_first, cfg.data.collector.prompt.action_list) == (True, "full")
    cfg = compose_cfg("env=sciworld", "env.prompt.action_list=compact", "env.prompt.fixed_first=true")
    assert cfg.data.collector.prompt.action_list == "compact"
    assert cfg.data.collector.prompt.actions_only is False
    cfg = compose_cfg("env=sciworld", "env.history_length=0", "env.prompt.actions_only=true")
    assert cfg.data.collector.prompt.actions_only is True
    assert compose_cfg().data.collector.prompt.fixed_first is False  # gridworld: the reference's


def _head_ids(tokenizer, builder: PromptBuilder, fixed: str) -> list[int]:
    """The ids of the chat up to the end of ``fixed`` (the template's header, then the fixed text)."""
    chat = tokenizer.apply_chat_template(builder.messages(fixed + "OBSERVATION"), add_generation_prompt=True,
                                         tokenize=False)
    return tokenizer.encode(chat[: chat.index("OBSERVATION")], add_special_tokens=False)


def _tokenizers(tokenizer):
    yield tokenizer  # tests/rollout/conftest.py's tiny ChatML tokenizer
    if (SMOLLM2 / "config.json").is_file():
        from lightning_epo.models.loading import load_tokenizer

        yield load_tokenizer({"name_or_path": str(SMOLLM2)})


@pytest.mark.parametrize("action_list", ["full", "compact", "none"])
@pytest.mark.parametrize(("history_length", "actions_only"), [(0, False), (2, False), (0, True)])
def test_every_turn_of_an_episode_begins_with_the_tokens_of_its_fixed_text(tokenizer, action_list, history_length,
                                                                           actions_only):
    """The fixed text's tokens are a prefix of every turn's prompt (no token merges across its end), and its part up
    to the task one of every prompt: what a prefix cache and the update's shared-prefix pass reuse."""
    builder = PromptBuilder("sciworld", history_length=history_length, think=False, fixed_first=True,
                            action_list=action_list, actions_only=actions_only)
    turns = [("This room is the kitchen.", ""), ("The door is now open.", "open door"), ("You move.", "go to hall")]
    for tok in _tokenizers(tokenizer):
        for task in ("boil water", "find a(n) animal"):
            head = _head_ids(tok, builder, sciworld_prompt.fixed_text(task, ACTIONS[:-1], action_list))
            history: list[tuple[str, str]] = []
            for step, (observation, action) in enumerate(turns):
                ids = builder.token_ids(tok, builder.text(task, observation, ACTIONS, history, step))
                assert ids[: len(head)] == head
                history.append((observation, action))


class Recording(ExpertEngine):
    """The expert, keeping every prompt it was given and the infos it answered."""

    def __init__(self, tokenizer) -> None:
        super().__init__(tokenizer)
        self.seen: list[tuple[list[int], dict]] = []

    def generate(self, prompts, sampling, infos=None):
        self.seen += [(list(p), dict(i)) for p, i in zip(prompts, infos)]
        return super().generate(prompts, sampling, infos)


@pytest.mark.sciworld
@pytest.mark.skipif(not HAS_SIMULATOR, reason="needs ScienceWorld and Java")
@pytest.mark.parametrize(("history_length", "actions_only"), [(2, False), (0, True)])
def test_a_sciworld_episode_trains_on_the_prompt_tokens_the_builder_made(tokenizer, history_length, actions_only):
    """The real simulator's gold path with the fixed-text-first layout: each row's prompt ids are the ids the engine
    was given, which are the builder's tokens of the text of that turn's observation, templates and objects, and of
    the episode's every earlier step (the collector keeps the history the prompt lists)."""
    from lightning_epo.envs.sciworld import SciWorldSuite
    from lightning_epo.envs.sync_pool import SyncEnvPool
    from lightning_epo.rollout.collector import EpisodeCollector

    builder = PromptBuilder("sciworld", history_length=history_length, think=False, fixed_first=True,
                            action_list="compact", actions_only=actions_only)
    suite = SciWorldSuite(gold_path=True, task_subset=["find-non-living-thing"])
    pool = SyncEnvPool(suite, 1)
    engine = Recording(tokenizer)
    try:
        collector = EpisodeCollector(pool, engine, tokenizer, builder, 8, max_prompt_tokens=10**5)
        episode = collector.collect([suite.tasks("train")[0]], [0], SamplingParams(max_new_tokens=32)).episodes[0]
    finally:
        pool.close()
    assert episode.won and len(episode.turns) == len(engine.seen) >= 3
    history: list[tuple[str, str]] = []
    head = None
    for step, (turn, (given, info)) in enumerate(zip(episode.turns, engine.seen)):
        assert turn.prompt_ids == given  # token in, token out
        text = builder.text(info["task"], turn.observation, info["admissible_actions"], history, step)
        assert given == builder.token_ids(tokenizer, text)
        head = head or _head_ids(tokenizer, builder, sciworld_prompt.fixed_text(
            info["task"], info["admissible_actions"][:-1], "compact"))
        assert given[: len(head)] == head
        history.append((turn.observation, turn.action or ""))

