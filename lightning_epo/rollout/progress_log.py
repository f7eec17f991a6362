"""A rollout's metrics (the ``train/*`` and ``perf/*`` rows of DESIGN.md's table) and the log line built from them,
so a run's console shows where the time of an RL step goes."""

from __future__ import annotations

from lightning_epo.rollout.collector import Rollout


def prefix_cache_share(stats: dict[str, float], name: str = "perf/prefix_cache_share") -> dict[str, float]:
    """``{name: share}``, the share of the prompts' tokens the engine's prefix cache served (their KV blocks reused,
    not computed), from a collection's ``stats`` (:class:`Rollout`); empty where the engine has no prefix cache."""
    if "cached_prompt_tokens" not in stats:
        return {}
    return {name: stats["cached_prompt_tokens"] / max(stats["prompt_tokens"], 1.0)}


def rollout_stats(rollout: Rollout, wall_s: float) -> dict[str, float]:
    """The ``train/*`` and ``perf/*`` rollout metrics of one batch (DESIGN.md metric table)."""
    eps, s = rollout.episodes, rollout.stats
    turns = sum(ep.num_turns for ep in eps)
    return prefix_cache_share(s) | {
        "train/reward": sum(ep.episode_return for ep in eps) / len(eps),
        "train/success": sum(ep.won for ep in eps) / len(eps),
        "train/turns": turns / len(eps),
        "train/invalid_action_rate": sum(ep.invalid_actions for ep in eps) / max(turns, 1),
        "train/format_error_rate": sum(ep.format_errors for ep in eps) / max(turns, 1),
        "train/prompts_shortened": s["prompts_shortened"] / max(turns, 1),
        "train/env_failures": s["env_failures"],
        "perf/rollout_s": wall_s,
        "perf/gen_s": s["gen_s"],
        "perf/env_s": s["env_s"],
        "perf/gen_tokens_per_s": s["gen_tokens"] / max(s["gen_s"], 1e-9),
        "perf/env_steps_per_s": s["env_steps"] / max(s["env_s"], 1e-9),
    }


def rollout_done_line(step: int, rollout: Rollout, stats: dict[str, float]) -> str:
    """``step 3: collected 16 episodes in 12.3 s (gen 10.2 s, 5210 tokens; env 2.1 s, 480 steps),
    success 0.25, reward 1.40`` for the INFO log after an RL step's rollout (``stats``: :func:`rollout_stats`);
    with a prefix cache the generation part ends ``, prompts 81 % cached``."""
    s = rollout.stats
    share = stats.get("perf/prefix_cache_share")
    cached = "" if share is None else f", prompts {100 * share:.0f} % cached"
    return (
        f"step {step}: collected {len(rollout.episodes)} episodes in {stats['perf/rollout_s']:.1f} s "
        f"(gen {s['gen_s']:.1f} s, {int(s['gen_tokens'])} tokens{cached}; "
        f"env {s['env_s']:.1f} s, {int(s['env_steps'])} steps), "
        f"success {stats['train/success']:.2f}, reward {stats['train/reward']:.2f}"
    )
