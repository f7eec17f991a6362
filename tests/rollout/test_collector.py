"""EpisodeCollector with a scripted env pool and a scripted engine; ExpertEngine playing the env's expert."""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

import pytest

from lightning_epo.core.errors import ConfigError
from lightning_epo.envs.base import EnvPool, StepResult, Task
from lightning_epo.envs.gridworld import GridworldSuite
from lightning_epo.envs.sync_pool import SyncEnvPool
from lightning_epo.rollout.batch import collate_episodes
from lightning_epo.rollout.collector import CollectionStopped, EpisodeCollector, Rollout
from lightning_epo.rollout.engine import Generation, GenerationEngine, SamplingParams
from lightning_epo.rollout.expert_engine import ExpertEngine
from lightning_epo.rollout.progress_log import rollout_stats
from lightning_epo.rollout.prompts import PromptBuilder

SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=32)
WIN_REWARD = 10.0


class ScriptedPool(EnvPool):
    """Each task ``variation`` is the number of ``good`` steps that win. ``bad`` is rejected by the
    simulator, ``crash`` fails the worker; ``obs_words`` pads observations to make prompts long."""

    def __init__(self, size: int, obs_words: int = 0, fail_reset: set[str] = frozenset(), with_expert: bool = True):
        self.size = size
        self.obs_words = obs_words
        self.fail_reset = fail_reset
        self.with_expert = with_expert
        self.state: dict[int, dict[str, Any]] = {}
        self.resets = 0

    def _obs(self, text: str) -> str:
        return " ".join(["filler"] * self.obs_words + [text])

    def _info(self, slot: int, **extra: Any) -> dict[str, Any]:
        s = self.state[slot]
        info = {"task": s["task"], "won": s["good"] >= s["need"], "admissible_actions": ["good", "bad"]}
        info["expert_action"] = "good" if self.with_expert else None
        return info | extra

    def reset(self, slots: list[int], tasks: list[Task]) -> list[StepResult]:
        results = []
        for slot, task in zip(slots, tasks):
            assert 0 <= slot < self.size
            self.resets += 1
            if task.name in self.fail_reset:
                results.append(StepResult("", failed=True))
                continue
            self.state[slot] = {"task": f"task {task.name}", "need": int(task.variation), "good": 0, "steps": 0}
            results.append(StepResult(self._obs(f"start of {task.name}"), info=self._info(slot)))
        return results

    def step(self, slots: list[int], actions: list[str]) -> list[StepResult]:
        results = []
        for slot, action in zip(slots, actions):
            s = self.state[slot]
            s["steps"] += 1
            if action == "crash":
                del self.state[slot]
                results.append(StepResult("", failed=True))
                continue
            valid = action == "good"
            s["good"] += valid
            won = s["good"] >= s["need"]
            obs = self._obs(f"step {s['steps']} after {action}")
            results.append(StepResult(obs, WIN_REWARD if won else 0.0, won, self._info(slot, action_valid=valid)))
            if won:
                del self.state[slot]
        return results

    def close(self) -> None:
        self.state.clear()


class ScriptedEngine(GenerationEngine):
    """Answers with a per-task script of response texts (the last entry repeats); records batch sizes.

    A script entry ``(text, "length")`` returns that text as a length-truncated response. ``cached``: a prefix
    cache that serves each prompt's first ``cached`` tokens (None: no cache)."""

    def __init__(self, tokenizer, scripts: dict[str, list], cached: int | None = None):
        self.tokenizer = tokenizer
        self.scripts = scripts
        self.cached = cached
        self.turns: dict[str, int] = defaultdict(int)
        self.batch_sizes: list[int] = []
        self.prompts: list[list[int]] = []

    def generate(self, prompts, sampling, infos=None):
        self.batch_sizes.append(len(prompts))
        self.prompts.extend(prompts)
        generations = []
        for prompt, info in zip(prompts, infos):
            script = self.scripts[info["task"]]
            entry = script[min(self.turns[info["task"]], len(script) - 1)]
            self.turns[info["task"]] += 1
            text, reason = entry if isinstance(entry, tuple) else (entry, "stop")
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            if reason == "stop":
                ids.append(self.tokenizer.eos_token_id)
            cached = None if self.cached is None else min(self.cached, len(prompt))
            generations.append(Generation(ids, [-1.0] * len(ids), reason, cached_prompt_tokens=cached))
        return generations


def _collect(tokenizer, pool, engine, tasks, max_turns=10, group_ids=None, think=False, **kwargs) -> Rollout:
    prompt = PromptBuilder("gridworld", think=think)
    collector = EpisodeCollector(pool, engine, tokenizer, prompt, max_turns, **kwargs)
    return collector.collect(tasks, group_ids or list(range(len(tasks))), SAMPLING, first_traj_id=100)


def test_turn_rewards_penalties_and_episode_summary(tokenizer):
    script = ["<action>bad</action>", "I forgot the tags", ("<action>good</action>", "length"), "<action>good</action>"]
    pool = ScriptedPool(size=1)
    engine = ScriptedEngine(tokenizer, {"task a": script})
    rollout = _collect(tokenizer, pool, engine, [Task("train", "a", 2)])

    (episode,) = rollout.episodes
    assert [t.reward for t in episode.turns] == pytest.approx([-0.1, -0.1, 0.0, WIN_REWARD])
    assert [t.action_valid for t in episode.turns] == [False, False, True, True]
    assert [t.action for t in episode.turns] == ["bad", None, "good", "good"]
    assert [t.response_truncated for t in episode.turns] == [False, False, True, False]
    assert [t.turn_idx for t in episode.turns] == [0, 1, 2, 3]
    assert episode.turns[2].observation == episode.turns[1].observation  # no step without an action
    assert episode.won and not episode.truncated
    assert episode.episode_return == pytest.approx(WIN_REWARD - 0.2)
    assert all(t.won and t.episode_return == pytest.approx(WIN_REWARD - 0.2) for t in episode.turns)
    assert all(t.response_logprobs == [-1.0] * len(t.response_ids) for t in episode.turns)
    assert all(t.response_ids[-1] == tokenizer.eos_token_id for i, t in enumerate(episode.turns) if i != 2)
    assert rollout.stats["env_steps"] == 3 and rollout.stats["env_failures"] == 0
    assert rollout.stats["gen_tokens"] == sum(len(t.response_ids) for t in episode.turns)
    assert rollout.stats["env_s"] >= 0 and rollout.stats["gen_s"] >= 0


def test_prompt_tokens_and_the_share_a_prefix_cache_served_are_counted(tokenizer):
    scripts = {"task a": ["<action>good</action>"], "task b": ["<action>bad</action>", "<action>good</action>"]}
    tasks = [Task("train", "a", 2), Task("train", "b", 1)]
    engine = ScriptedEngine(tokenizer, scripts, cached=16)
    rollout = _collect(tokenizer, ScriptedPool(size=2), engine, tasks)
    prompt_tokens = sum(len(p) for p in engine.prompts)
    assert len(engine.prompts) == 4 and rollout.stats["prompt_tokens"] == prompt_tokens
    assert rollout.stats["cached_prompt_tokens"] == 4 * 16
    assert rollout_stats(rollout, wall_s=1.0)["perf/prefix_cache_share"] == pytest.approx(64 / prompt_tokens)

    uncached = _collect(tokenizer, ScriptedPool(size=2), ScriptedEngine(tokenizer, scripts), tasks)
    assert uncached.stats["prompt_tokens"] == prompt_tokens and "cached_prompt_tokens" not in uncached.stats
    assert "perf/prefix_cache_share" not in rollout_stats(uncached, wall_s=1.0)  # no cache: no share, not a 0


def test_invalid_action_penalty_is_configurable(tokenizer):
    engine = ScriptedEngine(tokenizer, {"task a": ["<action>bad</action>", "no tag", "<action>good</action>"]})
    rollout = _collect(tokenizer, ScriptedPool(1), engine, [Task("train", "a", 1)], invalid_action_penalty=0.5)
    assert [t.reward for t in rollout.episodes[0].turns] == pytest.approx([-0.5, -0.5, WIN_REWARD])


def test_format_errors_are_told_apart_from_actions_the_simulator_rejects(tokenizer):
    """``format_ok`` is the answer's format alone (an <action> pair, and the other format rules), so a warm start's
    ``format_error_rate`` is not mixed with moves into walls; ``action_valid`` stays both together (the penalty)."""
    engine = ScriptedEngine(tokenizer, {"task a": ["<action>bad</action>", "no tag", "<action>good</action>"]})
    rollout = _collect(tokenizer, ScriptedPool(1), engine, [Task("train", "a", 1)])
    (episode,) = rollout.episodes
    assert [t.action_valid for t in episode.turns] == [False, False, True]
    assert [t.format_ok for t in episode.turns] == [True, False, True]
    assert episode.invalid_actions == 2 and episode.format_errors == 1
    stats = rollout_stats(rollout, wall_s=1.0)
    assert stats["train/invalid_action_rate"] == pytest.approx(2 / 3)
    assert stats["train/format_error_rate"] == pytest.approx(1 / 3)


def test_format_errors_play_the_action_and_pay_the_penalty(tokenizer):
    """verl-agent's other format rules: with think on, an action without <think></think> (or any answer with
    Chinese characters) is still played, and its turn pays the invalid-action penalty."""
    thought = "<think>ok</think><action>good</action>"
    script = ["<action>good</action>", thought + " 好", thought]
    engine = ScriptedEngine(tokenizer, {"task a": script})
    rollout = _collect(tokenizer, ScriptedPool(1), engine, [Task("train", "a", 3)], think=True)
    (episode,) = rollout.episodes
    assert episode.won and rollout.stats["env_steps"] == 3  # every action was played
    assert [t.action_valid for t in episode.turns] == [False, False, True]
    assert [t.format_ok for t in episode.turns] == [False, False, True]
    assert [t.reward for t in episode.turns] == pytest.approx([-0.1, -0.1, WIN_REWARD])


def test_turn_limit_truncates_the_episode(tokenizer):
    engine = ScriptedEngine(tokenizer, {"task a": ["<action>bad</action>"]})
    rollout = _collect(tokenizer, ScriptedPool(1), engine, [Task("train", "a", 1)], max_turns=3)
    (episode,) = rollout.episodes
    assert episode.num_turns == 3 and episode.truncated and not episode.won
    assert all(t.episode_truncated and not t.won for t in episode.turns)
    assert episode.episode_return == pytest.approx(-0.3)


def test_failed_step_truncates_and_is_counted(tokenizer):
    engine = ScriptedEngine(tokenizer, {"task a": ["<action>good</action>", "<action>crash</action>"]})
    rollout = _collect(tokenizer, ScriptedPool(1), engine, [Task("train", "a", 5)])
    (episode,) = rollout.episodes
    assert episode.num_turns == 2 and episode.truncated and not episode.won
    assert episode.turns[-1].action == "crash" and episode.turns[-1].reward == 0.0
    assert rollout.stats["env_failures"] == 1


def test_failed_reset_gives_an_empty_truncated_episode(tokenizer):
    pool = ScriptedPool(1, fail_reset={"a"})
    engine = ScriptedEngine(tokenizer, {"task b": ["<action>good</action>"]})
    rollout = _collect(tokenizer, pool, engine, [Task("train", "a", 1), Task("train", "b", 1)])
    assert rollout.episodes[0].num_turns == 0 and rollout.episodes[0].truncated
    assert rollout.episodes[1].won
    assert rollout.stats["env_failures"] == 1


def test_each_turn_reports_the_episodes_that_ended_in_it_a_failed_reset_included(tokenizer):
    """``on_turn`` (an evaluation's progress) is called after every turn with the episodes that ended since the last
    call: every episode once, when it ends, not when the call returns."""
    pool = ScriptedPool(2, fail_reset={"a"})
    engine = ScriptedEngine(tokenizer, {f"task {n}": ["<action>good</action>"] for n in "bcd"})
    tasks = [Task("train", "a", 1), Task("train", "b", 3), Task("train", "c", 1), Task("train", "d", 1)]
    turns: list[list[str]] = []
    collector = EpisodeCollector(pool, engine, tokenizer, PromptBuilder("gridworld"), max_turns=10)
    rollout = collector.collect(tasks, [0, 1, 2, 3], SAMPLING, on_turn=lambda ended: turns.append([e.task for e in ended]))
    # two slots: a's reset fails (reported with the first turn, which b plays alone), c starts in a's slot and wins in
    # turn 2, d in c's slot and wins in turn 3, as b does (its third good step)
    assert turns == [["a"], ["task c"], ["task b", "task d"]]
    assert sorted(sum(turns, [])) == sorted(ep.task for ep in rollout.episodes)


def test_a_stop_request_ends_the_collection_between_two_turns(tokenizer):
    """``should_stop`` (a preemption during an evaluation) is asked before every turn: the first True ends the call
    with CollectionStopped, no further turn generated, and no episodes returned."""
    engine = ScriptedEngine(tokenizer, {"task a": ["<action>bad</action>"], "task b": ["<action>bad</action>"]})
    collector = EpisodeCollector(ScriptedPool(2), engine, tokenizer, PromptBuilder("gridworld"), max_turns=50)
    with pytest.raises(CollectionStopped, match="after 0 of 2 episodes"):
        collector.collect([Task("train", "a", 1), Task("train", "b", 1)], [0, 1], SAMPLING,
                          should_stop=lambda: len(engine.batch_sizes) >= 3)
    assert len(engine.batch_sizes) == 3  # three turns played, the fourth never asked for


def test_waves_refill_slots_and_keep_ids_in_task_order(tokenizer):
    tasks = [Task("train", name, need) for name, need in zip("abcde", [3, 1, 2, 1, 2])]
    engine = ScriptedEngine(tokenizer, {f"task {t.name}": ["<action>good</action>"] for t in tasks})
    pool = ScriptedPool(size=2)
    rollout = _collect(tokenizer, pool, engine, tasks, group_ids=[7, 7, 8, 8, 9])

    assert [e.traj_id for e in rollout.episodes] == [100, 101, 102, 103, 104]
    assert [e.group_id for e in rollout.episodes] == [7, 7, 8, 8, 9]
    assert [e.task for e in rollout.episodes] == [f"task {n}" for n in "abcde"]
    assert [e.num_turns for e in rollout.episodes] == [3, 1, 2, 1, 2]
    assert all(e.won for e in rollout.episodes)
    for e in rollout.episodes:
        assert all(t.traj_id == e.traj_id and t.group_id == e.group_id for t in e.turns)
    assert max(engine.batch_sizes) == 2 and pool.resets == 5
    assert sum(engine.batch_sizes) == rollout.stats["env_steps"] == 9


def test_prompts_show_the_last_history_length_pairs(tokenizer):
    engine = ScriptedEngine(tokenizer, {"task a": ["<action>bad</action>", "no tag", "<action>bad</action>"]})
    rollout = _collect(tokenizer, ScriptedPool(1), engine, [Task("train", "a", 1)], max_turns=4)
    last = tokenizer.decode(rollout.episodes[0].turns[3].prompt_ids)
    assert last.count("[Observation ") == 2
    assert "Action 2: ''" in last  # the turn without a parsed action
    assert "[Observation 3: 'step 1 after bad', Action 3: 'bad']" in last
    assert "You are now at step 4" in last


def test_sciworld_prompts_list_every_earlier_action(tokenizer):
    engine = ScriptedEngine(tokenizer, {"task a": ["<action>bad</action>"]})
    prompt = PromptBuilder("sciworld", history_length=2)
    collector = EpisodeCollector(ScriptedPool(1), engine, tokenizer, prompt, 5, max_prompt_tokens=10**5)  # tiny vocab
    rollout = collector.collect([Task("train", "a", 1)], [0], SAMPLING)
    last = tokenizer.decode(rollout.episodes[0].turns[4].prompt_ids)
    assert (
        "took: [Step 1, Action 1: 'bad']\n[Step 2, Action 2: 'bad']\n"
        "[Step 3, Observation 3: 'step 2 after bad', Action 3: 'bad']\n"
        "[Step 4, Observation 4: 'step 3 after bad', Action 4: 'bad']\nYou are now at step 5"
    ) in last


def test_long_prompts_drop_history_then_cut_the_observation(tokenizer):
    pool = ScriptedPool(1, obs_words=20)
    obs = [pool._obs("start of a")] + [pool._obs(f"step {n} after bad") for n in (1, 2, 3)]
    builder = PromptBuilder("gridworld", think=False)
    one_entry = builder.token_ids(tokenizer, builder.text("task a", obs[3], ["good", "bad"], [(obs[2], "bad")], 3))
    limit = len(one_entry)  # at turn 3 the second history entry does not fit, the first does
    engine = ScriptedEngine(tokenizer, {"task a": ["<action>bad</action>"]})
    rollout = _collect(tokenizer, pool, engine, [Task("train", "a", 1)], max_turns=4, max_prompt_tokens=limit)

    turns = rollout.episodes[0].turns
    assert all(len(t.prompt_ids) <= limit for t in turns)
    assert all(len(p) <= limit for p in engine.prompts)
    assert turns[3].prompt_ids == one_entry  # oldest history entry dropped, observation whole

    tight = _collect(
        tokenizer, ScriptedPool(1, obs_words=200), engine, [Task("train", "a", 1)], max_turns=2, max_prompt_tokens=limit
    )
    for turn in tight.episodes[0].turns:
        text = tokenizer.decode(turn.prompt_ids)
        assert len(turn.prompt_ids) <= limit and "observation is: ..." in text and "Prior to this step" not in text
    assert "filler start of a" in tokenizer.decode(tight.episodes[0].turns[0].prompt_ids)  # cut from the left
    assert tight.stats["prompts_shortened"] == len(tight.episodes[0].turns)  # every prompt cut


def test_the_rollout_counts_the_prompts_it_shortened(tokenizer):
    pool = ScriptedPool(1, obs_words=20)
    obs = [pool._obs("start of a")] + [pool._obs(f"step {n} after bad") for n in (1, 2, 3)]
    builder = PromptBuilder("gridworld", think=False)
    limit = len(builder.token_ids(tokenizer, builder.text("task a", obs[3], ["good", "bad"], [(obs[2], "bad")], 3)))
    engine = ScriptedEngine(tokenizer, {"task a": ["<action>bad</action>"]})
    whole = _collect(tokenizer, ScriptedPool(1, obs_words=20), engine, [Task("train", "a", 1)], max_turns=4)
    short = _collect(tokenizer, pool, engine, [Task("train", "a", 1)], max_turns=4, max_prompt_tokens=limit)
    differ = sum(a.prompt_ids != b.prompt_ids for a, b in zip(whole.episodes[0].turns, short.episodes[0].turns))
    assert whole.stats["prompts_shortened"] == 0
    assert short.stats["prompts_shortened"] == differ >= 1


def test_prompt_that_cannot_fit_fails_clearly(tokenizer):
    engine = ScriptedEngine(tokenizer, {"task a": ["<action>good</action>"]})
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        _collect(tokenizer, ScriptedPool(1), engine, [Task("train", "a", 1)], max_prompt_tokens=20)


def test_mismatched_group_ids_fail_clearly(tokenizer):
    collector = EpisodeCollector(ScriptedPool(1), ExpertEngine(tokenizer), tokenizer, PromptBuilder("gridworld"), 5)
    with pytest.raises(ValueError, match="group ids"):
        collector.collect([Task("train", "a", 1)], [0, 1], SAMPLING)


@pytest.mark.parametrize("think", [False, True])
def test_expert_engine_wins_a_scripted_env(tokenizer, think):
    engine = ExpertEngine(tokenizer, think=think)
    tasks = [Task("train", "a", 3), Task("train", "b", 2)]
    rollout = _collect(tokenizer, ScriptedPool(2), engine, tasks)
    assert all(e.won and not e.truncated for e in rollout.episodes)
    assert [e.num_turns for e in rollout.episodes] == [3, 2]
    turn = rollout.episodes[0].turns[0]
    assert turn.response_ids[-1] == tokenizer.eos_token_id
    assert turn.response_logprobs is None  # the expert samples from no policy: nothing to score its tokens by
    assert turn.response_text == ("<think></think>" if think else "") + "<action>good</action>"


def test_expert_engine_without_expert_action_fails_clearly(tokenizer):
    engine = ExpertEngine(tokenizer)
    with pytest.raises(ValueError, match="expert_action.*task a"):
        _collect(tokenizer, ScriptedPool(1, with_expert=False), engine, [Task("train", "a", 1)])


def test_noisy_expert_plays_a_random_explore_action_at_its_rate(tokenizer):
    """explore_prob 0 / 1 give only expert / only explore actions; 0.3 gives about 30 % explore actions,
    the same ones again after reseeding (Python's random, reseeded per RL step)."""
    infos = [{"expert_action": "good", "task": "a"}] * 400
    prompts = [[1]] * 400

    def actions(prob):
        engine = ExpertEngine(tokenizer, explore_prob=prob, explore_actions=["left", "right"])
        return [tokenizer.decode(g.token_ids[:-1]) for g in engine.generate(prompts, SAMPLING, infos)]

    assert set(actions(0.0)) == {"<action>good</action>"}
    assert set(actions(1.0)) == {"<action>left</action>", "<action>right</action>"}
    random.seed(7)
    noisy = actions(0.3)
    assert 0.22 < sum(a != "<action>good</action>" for a in noisy) / len(noisy) < 0.38
    random.seed(7)
    assert actions(0.3) == noisy


@pytest.mark.parametrize("prob,explore,match", [(1.5, ["x"], "in \\[0, 1\\]"), (0.2, [], "explore_actions")])
def test_noisy_expert_settings_fail_clearly(tokenizer, prob, explore, match):
    with pytest.raises(ConfigError, match=match):
        ExpertEngine(tokenizer, explore_prob=prob, explore_actions=explore)


def test_noisy_expert_turns_are_played_but_only_the_expert_turns_are_learned(tokenizer):
    """DART: an exploratory turn stays in the episode (it moved the agent) but its row has no response
    mask; every row that is trained on holds the expert's answer for the state it was played in."""
    suite = GridworldSuite(num_train_tasks=8)
    engine = ExpertEngine(tokenizer, explore_prob=0.5, explore_actions=["go north", "go south", "go east", "go west"])
    random.seed(3)
    rollout = _collect(tokenizer, SyncEnvPool(suite, 8), engine, suite.tasks("train"), max_turns=12)
    turns = [t for ep in rollout.episodes for t in ep.turns]
    batch = collate_episodes(rollout.episodes, pad_token_id=tokenizer.pad_token_id)

    assert {t.learned for t in turns} == {True, False}
    assert batch.response_mask.any(-1).tolist() == [t.learned for t in turns]
    for task, episode in zip(suite.tasks("train"), rollout.episodes):
        env = suite.make_env()
        _, info = env.reset(task)
        for turn in episode.turns:
            if turn.learned:
                assert turn.action == info["expert_action"]
            _, _, _, info = env.step(turn.action)
