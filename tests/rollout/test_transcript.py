"""``env.prompt.transcript``: an episode is one chat. Each turn's prompt is the previous turn's prompt and answer,
token for token, then the new user message, so an episode's rows fold into its last (``model.fold_turns``); a
transcript past ``model.max_prompt_tokens`` starts over; with the real simulator where ScienceWorld and Java are
installed."""

from __future__ import annotations

import pytest

from lightning_epo.core.errors import ConfigError
from lightning_epo.envs.gridworld import GridworldSuite
from lightning_epo.envs.sync_pool import SyncEnvPool
from lightning_epo.models.shared_prefix import prefix_hosts
from lightning_epo.rollout.batch import collate_episodes
from lightning_epo.rollout.collector import EpisodeCollector
from lightning_epo.rollout.engine import Generation, GenerationEngine, SamplingParams
from lightning_epo.rollout.expert_engine import ExpertEngine
from lightning_epo.rollout.prompts import PromptBuilder, chat_token_ids
from tests.rollout.test_sciworld_layout import ACTIONS, HAS_SIMULATOR, Recording, _tokenizers

SAMPLING = SamplingParams(max_new_tokens=32)


def _sciworld(**kwargs) -> PromptBuilder:
    return PromptBuilder("sciworld", history_length=0, think=False, fixed_first=True, action_list="none",
                         transcript=True, **kwargs)


def test_a_later_turn_adds_the_observation_the_objects_present_and_the_instruction():
    assert _sciworld().next_text("The door is now open.", ACTIONS) == (
        "Your current observation is: The door is now open.\n"
        "OBJ needs to be replaced with one of the following objects: ['air', 'door']\n\n"
        "Now it's your turn to take an action.\n"
        "Choose an appropriate action for the current step and present it within <action> </action> tags.")
    grid = PromptBuilder("gridworld", history_length=0, think=False, transcript=True)
    assert grid.next_text("You moved.", ["go north", "go east"]) == (
        "Your current observation is: You moved.\n"
        "Your admissible actions of the current situation are: ['go north'\n 'go east'].\n\n"
        "Now it's your turn to take an action.\n"
        "Choose an admissible action for current step and present it within <action> </action> tags.")


@pytest.mark.parametrize("env", ["sciworld", "gridworld"])
def test_a_transcript_is_the_chat_of_the_episode_as_played(tokenizer, env):
    """Each prompt begins with the previous prompt and its answer, token for token; with answers closed by the eos
    token the whole equals the chat template's rendering of the conversation (first message, answers, later
    messages)."""
    builder = _sciworld() if env == "sciworld" else PromptBuilder(env, history_length=0, think=False, transcript=True)
    answers = ["<action>open door</action>", "<action>go to hallway</action>"]
    for tok in _tokenizers(tokenizer):
        first = builder.text("find a(n) animal", "This room is the kitchen.", ACTIONS, [], 0)
        prompt = builder.token_ids(tok, first)
        messages = [{"role": "user", "content": first}]
        for answer, observation in zip(answers, ["The door is now open.", "You move to the hallway. <|im_end|>"]):
            said = tok.encode(answer, add_special_tokens=False) + [tok.eos_token_id]
            following = builder.continued_ids(tok, prompt, said, observation, ACTIONS)
            assert following[: len(prompt) + len(said)] == prompt + said
            messages += [{"role": "assistant", "content": answer},
                         {"role": "user", "content": builder.next_text(observation, ACTIONS)}]
            assert following == chat_token_ids(tok, messages)  # the literal <|im_end|> stays text
            prompt = following


def test_an_answer_cut_before_its_eos_token_is_closed_by_the_template(tokenizer):
    builder = _sciworld()
    prompt = builder.token_ids(tokenizer, builder.text("boil water", "Kitchen.", ACTIONS, [], 0))
    cut = tokenizer.encode("<action>open do", add_special_tokens=False)
    following = builder.continued_ids(tokenizer, prompt, cut, "Nothing happens.", ACTIONS)
    assert following[len(prompt) + len(cut)] == tokenizer.eos_token_id  # the template's end of the turn
    closed = builder.continued_ids(tokenizer, prompt, cut + [tokenizer.eos_token_id], "Nothing happens.", ACTIONS)
    assert following == closed


def test_a_transcript_is_refused_beside_a_history_of_its_own():
    with pytest.raises(ConfigError, match="env.history_length=2 would show again: set env.history_length=0"):
        PromptBuilder("gridworld", history_length=2, transcript=True)
    with pytest.raises(ConfigError, match="env.prompt.actions_only=true would show again"):
        PromptBuilder("sciworld", history_length=0, fixed_first=True, actions_only=True, transcript=True)
    assert _sciworld().history_needed == 0  # the collector keeps no pairs: the earlier turns are in the rows


def test_the_env_config_sets_the_transcript_the_collector_builds(compose_cfg):
    assert compose_cfg().data.collector.prompt.transcript is False
    cfg = compose_cfg("env=sciworld", "env.history_length=0", "env.prompt.transcript=true")
    assert cfg.data.collector.prompt.transcript is True
    assert compose_cfg("env.history_length=0", "env.prompt.transcript=true").data.collector.prompt.transcript is True


class CutSecond(GenerationEngine):
    """The expert, keeping the infos it answered, but its second call's answers (every episode's second turn: the
    episodes start together) cut at 3 tokens without the eos token (``length``)."""

    def __init__(self, tokenizer) -> None:
        self.expert = ExpertEngine(tokenizer)
        self.infos: list[dict] = []
        self.calls = 0

    def generate(self, prompts, sampling, infos=None):
        self.infos += infos
        self.calls += 1
        answers = self.expert.generate(prompts, sampling, infos)
        return [Generation(g.token_ids[:3], None, "length") if self.calls == 2 else g for g in answers]


def _gridworld_rollout(tokenizer, max_prompt_tokens: int, tasks: int = 3):
    suite = GridworldSuite(num_train_tasks=tasks, min_distance=3, max_distance=4)
    pool = SyncEnvPool(suite, tasks)
    engine = CutSecond(tokenizer)
    builder = PromptBuilder("gridworld", history_length=0, think=False, transcript=True)
    try:
        collector = EpisodeCollector(pool, engine, tokenizer, builder, 8, max_prompt_tokens=max_prompt_tokens)
        rollout = collector.collect(suite.tasks("train")[:tasks], list(range(tasks)), SAMPLING)
    finally:
        pool.close()
    return rollout, builder, engine.infos


def test_each_turn_of_a_collected_episode_continues_the_previous_row_and_the_episode_folds_into_its_last(tokenizer):
    rollout, _, _ = _gridworld_rollout(tokenizer, max_prompt_tokens=10**5)
    episodes = rollout.episodes
    assert rollout.stats["prompts_shortened"] == 0
    assert all(len(e.turns) >= 3 for e in episodes)
    for episode in episodes:
        assert episode.turns[1].response_ids[-1] != tokenizer.eos_token_id  # the cut answer
        for before, turn in zip(episode.turns, episode.turns[1:]):
            row = before.prompt_ids + before.response_ids
            assert turn.prompt_ids[: len(row)] == row and len(turn.prompt_ids) > len(row)
    batch = collate_episodes(episodes, pad_token_id=tokenizer.pad_token_id)
    hosts = prefix_hosts(batch.input_ids, batch.attention_mask)
    last_rows = [int((batch.traj_ids == e.traj_id).nonzero().max()) for e in episodes]
    assert sorted(set(hosts.tolist())) == sorted(last_rows)  # one decoder row an episode


def test_a_transcript_past_max_prompt_tokens_starts_over_from_the_first_step_prompt(tokenizer):
    (whole,) = _gridworld_rollout(tokenizer, max_prompt_tokens=10**5, tasks=1)[0].episodes
    limit = len(whole.turns[2].prompt_ids) - 1  # the third turn's transcript is over it
    rollout, builder, infos = _gridworld_rollout(tokenizer, max_prompt_tokens=limit, tasks=1)
    (episode,) = rollout.episodes
    first, second, third, *rest = episode.turns
    assert second.prompt_ids == whole.turns[1].prompt_ids
    assert third.prompt_ids == builder.token_ids(tokenizer, builder.text(
        episode.task, third.observation, infos[2]["admissible_actions"], [], 2))
    assert rest, "the episode ended before a turn could continue the new start"
    row = third.prompt_ids + third.response_ids
    assert rest[0].prompt_ids[: len(row)] == row
    starts = sum(t.prompt_ids[: len(b.prompt_ids)] != b.prompt_ids for b, t in zip(episode.turns, episode.turns[1:]))
    assert rollout.stats["prompts_shortened"] == starts >= 1  # each start over counted


@pytest.mark.sciworld
@pytest.mark.skipif(not HAS_SIMULATOR, reason="needs ScienceWorld and Java")
def test_a_sciworld_gold_path_played_as_a_transcript(tokenizer):
    """The real simulator's gold path: the first prompt is the builder's first-step prompt, each later one the
    previous prompt and answer with the builder's message of the observation and objects the engine was given."""
    from lightning_epo.envs.sciworld import SciWorldSuite

    builder = _sciworld()
    suite = SciWorldSuite(gold_path=True, task_subset=["find-non-living-thing"])
    pool = SyncEnvPool(suite, 1)
    engine = Recording(tokenizer)
    try:
        collector = EpisodeCollector(pool, engine, tokenizer, builder, 8, max_prompt_tokens=10**5)
        episode = collector.collect([suite.tasks("train")[0]], [0], SAMPLING).episodes[0]
    finally:
        pool.close()
    assert episode.won and len(episode.turns) == len(engine.seen) >= 3
    (given, info), *later = engine.seen
    assert given == builder.token_ids(tokenizer, builder.text(info["task"], episode.turns[0].observation,
                                                              info["admissible_actions"], [], 0))
    for before, turn, (given, info) in zip(episode.turns, episode.turns[1:], later):
        assert turn.prompt_ids == given == builder.continued_ids(
            tokenizer, before.prompt_ids, before.response_ids, turn.observation, info["admissible_actions"])
