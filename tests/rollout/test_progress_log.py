"""The rollout-phase log line."""

from lightning_epo.rollout.collector import Rollout
from lightning_epo.rollout.episode import Episode
from lightning_epo.rollout.progress_log import rollout_done_line, rollout_stats


def test_rollout_done_line_reports_time_split_and_outcomes():
    episodes = [Episode(0, 0, "t", won=True, episode_return=10.0), Episode(1, 1, "t", episode_return=-1.0)]
    stats = dict(gen_s=10.24, gen_tokens=5210.0, env_s=2.06, env_steps=48.0, env_failures=0.0)
    rollout = Rollout(episodes, stats)
    line = rollout_done_line(3, rollout, rollout_stats(rollout, wall_s=12.34))
    assert line == (
        "step 3: collected 2 episodes in 12.3 s (gen 10.2 s, 5210 tokens; env 2.1 s, 48 steps), success 0.50, reward 4.50"
    )
