"""The rollout-phase log line."""

import pytest

from lightning_epo.core.metric_names import ROLLOUT_COUNTS, ROLLOUT_MEANS
from lightning_epo.rollout.collector import Rollout
from lightning_epo.rollout.episode import Episode, TurnSample
from lightning_epo.rollout.progress_log import rollout_done_line, rollout_stats


def test_rollout_done_line_reports_time_split_and_outcomes():
    episodes = [Episode(0, 0, "t", won=True, episode_return=10.0), Episode(1, 1, "t", episode_return=-1.0)]
    stats = dict(gen_s=10.24, gen_tokens=5210.0, env_s=2.06, env_steps=48.0, env_failures=0.0, prompts_shortened=0.0)
    rollout = Rollout(episodes, stats)
    line = rollout_done_line(3, rollout, rollout_stats(rollout, wall_s=12.34))
    assert line == (
        "step 3: collected 2 episodes in 12.3 s (gen 10.2 s, 5210 tokens; env 2.1 s, 48 steps), success 0.50, reward 4.50"
    )


def test_rollout_metrics_are_named_in_the_one_table():
    episodes = [Episode(0, 0, "t", won=True, episode_return=10.0)]
    stats = dict(gen_s=1.0, gen_tokens=10.0, env_s=1.0, env_steps=4.0, env_failures=0.0, prompts_shortened=0.0)
    names = set(rollout_stats(Rollout(episodes, stats), wall_s=2.0))
    assert names <= set(ROLLOUT_MEANS + ROLLOUT_COUNTS), names - set(ROLLOUT_MEANS + ROLLOUT_COUNTS)


def test_with_a_prefix_cache_the_line_says_the_share_of_prompt_tokens_it_served():
    episodes = [Episode(0, 0, "t", won=True, episode_return=10.0)]
    stats = dict(gen_s=1.0, gen_tokens=10.0, prompt_tokens=400.0, cached_prompt_tokens=324.0, env_s=1.0,
                 env_steps=4.0, env_failures=0.0, prompts_shortened=0.0)
    rollout = Rollout(episodes, stats)
    metrics = rollout_stats(rollout, wall_s=2.0)
    assert metrics["perf/prefix_cache_share"] == pytest.approx(0.81)
    assert "(gen 1.0 s, 10 tokens, prompts 81 % cached; env 1.0 s" in rollout_done_line(0, rollout, metrics)


def test_the_share_of_shortened_prompts_is_over_the_turns_played():
    episodes = [Episode(e, e, "t", turns=[TurnSample([1], [2], e, i, e) for i in range(n)]) for e, n in [(0, 3), (1, 5)]]
    stats = dict(gen_s=1.0, gen_tokens=10.0, env_s=1.0, env_steps=8.0, env_failures=0.0, prompts_shortened=2.0)
    assert rollout_stats(Rollout(episodes, stats), wall_s=2.0)["train/prompts_shortened"] == pytest.approx(0.25)
