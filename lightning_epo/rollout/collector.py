"""Play episodes turn by turn: env pool -> prompt tokens -> engine -> parsed action -> env pool.

One engine call per turn generates for every running episode at once. Episodes run in the pool's
slots; when an episode ends, its slot starts the next waiting task, so at most ``pool.size`` episodes
run at a time (waves that refill as slots free up).

Per turn (DESIGN.md, "Environment contract" and "The episode record"):

- no ``<action>...</action>`` in the response: no environment step, the observation stays, the turn's
  reward is ``-invalid_action_penalty`` and ``action_valid`` is False;
- an action the simulator rejects (``info["action_valid"]`` False), or a response that breaks the other format
  rules (``format_valid``: think tags when the prompt asks for them, no Chinese characters; the action is still
  played, as in verl-agent): reward ``env reward - penalty``, ``action_valid`` False;
- the episode ends when the env says ``done``, at ``max_turns`` (``truncated``), or when the pool
  reports a failed worker (``truncated``, counted in ``env_failures``; that turn is still recorded).

A caller may watch a collection (``on_turn``: after every turn, the episodes that ended in it, for a progress
display) and stop it between two turns (``should_stop``: a preemption signal during an evaluation): it then raises
:class:`CollectionStopped` and returns nothing, so no partial result exists.

The history shown in prompts holds (observation seen, parsed action) pairs, as many as the prompt
uses (``PromptBuilder.history_needed``); a turn without a parsed action enters it with an empty action
``''``, so the agent sees that its step did nothing.
Prompts longer than ``max_prompt_tokens`` are shortened: first the oldest history entries go, then
the observation is cut from the left (marked with ``...``). ``stats["prompts_shortened"]`` counts the turns whose
prompt was shortened (a transcript's start over included; ``train/prompts_shortened``, a share of the turns).

With ``env.prompt.transcript`` (``PromptBuilder.transcript``) a turn's prompt is the previous turn's prompt and
answer, token for token, then the new user message (``PromptBuilder.continued_ids``); a transcript that would
pass ``max_prompt_tokens`` starts over from the turn's first-step prompt, and the next turns continue that one.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from lightning_epo.core.errors import ConfigError
from lightning_epo.envs.base import EnvPool, StepResult, Task
from lightning_epo.rollout.engine import Generation, GenerationEngine, SamplingParams
from lightning_epo.rollout.episode import Episode, TurnSample
from lightning_epo.rollout.prompts import PromptBuilder, format_valid, parse_action

TRUNCATION_MARK = "..."


def fixed_prompt_tokens(prompt: PromptBuilder, tokenizer: Any) -> int:
    """The length of every prompt's fixed part: the first-turn prompt with an empty task, an observation cut to
    nothing (:data:`TRUNCATION_MARK`) and no action list. No prompt of ``prompt`` is shorter, however much
    :meth:`EpisodeCollector._prompt_ids` shortens it."""
    return len(prompt.token_ids(tokenizer, prompt.text("", TRUNCATION_MARK, None, [], 0)))


class CollectionStopped(RuntimeError):
    """``collect`` stopped between two turns because its ``should_stop`` said so; its episodes are discarded."""


@dataclass
class Rollout:
    """The episodes of one ``collect`` call (in task order) and its counters.

    ``stats``: ``env_s`` (seconds in env reset/step), ``gen_s`` (seconds generating), ``gen_tokens``
    (generated tokens), ``prompt_tokens`` (the prompts' tokens), ``env_steps`` (actions sent to environments),
    ``env_failures`` (failed resets/steps); with an engine that has a prefix cache, ``cached_prompt_tokens`` (the
    prompt tokens it served from the cache: :attr:`Generation.cached_prompt_tokens`).
    """

    episodes: list[Episode]
    stats: dict[str, float] = field(default_factory=dict)


@dataclass
class _Running:
    """One episode in progress in one pool slot."""

    index: int
    slot: int
    episode: Episode
    observation: str
    info: dict[str, Any]
    history: list[tuple[str, str]] = field(default_factory=list)
    ended: bool = False


class EpisodeCollector:
    """Collects episodes from an :class:`EnvPool` with a :class:`GenerationEngine`."""

    def __init__(
        self,
        pool: EnvPool,
        engine: GenerationEngine,
        tokenizer: Any,
        prompt: PromptBuilder,
        max_turns: int,
        invalid_action_penalty: float = 0.1,
        max_prompt_tokens: int = 2048,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"env.max_turns must be >= 1, got {max_turns}")
        if pool.size < 1:
            raise ValueError(f"the env pool needs at least one slot, got size {pool.size}; set env.pool_size >= 1")
        self.pool = pool
        self.engine = engine
        self.tokenizer = tokenizer
        self.prompt = prompt
        self.max_turns = max_turns
        self.invalid_action_penalty = invalid_action_penalty
        self.max_prompt_tokens = max_prompt_tokens

    def collect(
        self,
        tasks: list[Task],
        group_ids: list[int],
        sampling: SamplingParams,
        first_traj_id: int = 0,
        on_turn: Callable[[list[Episode]], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> Rollout:
        """Play one episode per task; episode ``i`` gets ``traj_id = first_traj_id + i`` and ``group_ids[i]``.
        ``on_turn`` is called after every turn with the episodes that ended since the last call (a failed reset's
        included); ``should_stop`` is asked before every turn, and a True raises :class:`CollectionStopped`."""
        if len(tasks) != len(group_ids):
            raise ValueError(f"collect got {len(tasks)} tasks but {len(group_ids)} group ids; pass one per task")
        stats = dict(env_s=0.0, gen_s=0.0, gen_tokens=0.0, prompt_tokens=0.0, env_steps=0.0, env_failures=0.0,
                     prompts_shortened=0.0)
        episodes: list[Episode | None] = [None] * len(tasks)
        waiting = deque(range(len(tasks)))
        running: list[_Running] = []
        ended: list[int] = []  # indices of the episodes that ended since the last on_turn
        while waiting or running:
            if should_stop is not None and should_stop():
                done = sum(episode is not None for episode in episodes)
                raise CollectionStopped(f"stopped after {done} of {len(tasks)} episodes")
            free = sorted(set(range(self.pool.size)) - {r.slot for r in running})
            starts = [(slot, waiting.popleft()) for slot in free[: len(waiting)]]
            if starts:
                running.extend(self._start(starts, tasks, group_ids, first_traj_id, episodes, stats))
                ended.extend(index for _, index in starts if episodes[index] is not None)  # a failed reset
            if running:
                self._turn(running, sampling, stats)
                for run in running:
                    if run.ended:
                        episodes[run.index] = run.episode
                        ended.append(run.index)
                running = [r for r in running if not r.ended]
            if on_turn is not None:
                on_turn([episodes[index] for index in ended])
            ended.clear()
        return Rollout(episodes=list(episodes), stats=stats)

    def _start(
        self,
        starts: list[tuple[int, int]],
        tasks: list[Task],
        group_ids: list[int],
        first_traj_id: int,
        episodes: list[Episode | None],
        stats: dict[str, float],
    ) -> list[_Running]:
        """Reset the given (slot, task index) pairs; a failed reset ends its episode with no turns."""
        began = time.perf_counter()
        results = self.pool.reset([slot for slot, _ in starts], [tasks[i] for _, i in starts])
        stats["env_s"] += time.perf_counter() - began
        started = []
        for (slot, index), result in zip(starts, results):
            task_text = result.info.get("task")
            episode = Episode(traj_id=first_traj_id + index, group_id=group_ids[index], task=task_text or tasks[index].name,
                              task_name=tasks[index].name)
            if result.failed:
                stats["env_failures"] += 1
                episode.truncated = True
                episodes[index] = episode
                continue
            if task_text is None:
                raise ValueError(f"the environment's reset info for {tasks[index]} has no 'task' text (env contract)")
            started.append(_Running(index, slot, episode, result.observation, result.info))
        return started

    def _turn(self, running: list[_Running], sampling: SamplingParams, stats: dict[str, float]) -> None:
        """One generation call for all running episodes, then one pool step for those with an action."""
        prompts = [self._prompt_ids(r, stats) for r in running]
        began = time.perf_counter()
        generations = self.engine.generate(prompts, sampling, [r.info for r in running])
        stats["gen_s"] += time.perf_counter() - began
        if len(generations) != len(running):
            raise RuntimeError(f"engine returned {len(generations)} generations for {len(running)} prompts")
        stats["gen_tokens"] += sum(len(g.token_ids) for g in generations)
        stats["prompt_tokens"] += sum(len(p) for p in prompts)
        cached = [g.cached_prompt_tokens for g in generations if g.cached_prompt_tokens is not None]
        if cached:
            stats["cached_prompt_tokens"] = stats.get("cached_prompt_tokens", 0.0) + sum(cached)

        samples = [self._sample(r, p, g) for r, p, g in zip(running, prompts, generations)]
        stepping = [i for i, s in enumerate(samples) if s.action is not None]
        results: dict[int, StepResult] = {}
        if stepping:
            began = time.perf_counter()
            stepped = self.pool.step([running[i].slot for i in stepping], [samples[i].action for i in stepping])
            stats["env_s"] += time.perf_counter() - began
            stats["env_steps"] += len(stepping)
            results = dict(zip(stepping, stepped))
        for i, (run, sample) in enumerate(zip(running, samples)):
            self._apply(run, sample, results.get(i), stats)

    def _sample(self, run: _Running, prompt_ids: list[int], generation: Generation) -> TurnSample:
        text = self.tokenizer.decode(generation.token_ids, skip_special_tokens=True)
        action, formatted = parse_action(text), format_valid(text, self.prompt.think)
        return TurnSample(
            prompt_ids=prompt_ids,
            response_ids=list(generation.token_ids),
            traj_id=run.episode.traj_id,
            turn_idx=run.episode.num_turns,
            group_id=run.episode.group_id,
            response_truncated=generation.finish_reason == "length",
            learned=generation.learned,
            action_valid=formatted,
            format_ok=formatted and action is not None,
            response_logprobs=None if generation.logprobs is None else list(generation.logprobs),
            task=run.episode.task,
            response_text=text,
            action=action,
            observation=run.observation,
        )

    def _apply(self, run: _Running, sample: TurnSample, result: StepResult | None, stats: dict[str, float]) -> None:
        """Score the turn, record it, advance the episode and close it when it ends."""
        episode = run.episode
        run.history.append((run.observation, sample.action or ""))
        if self.prompt.history_needed is not None:
            del run.history[: max(0, len(run.history) - self.prompt.history_needed)]
        ended = False
        if result is None:
            sample.action_valid = False
            sample.reward = -self.invalid_action_penalty
        elif result.failed:
            stats["env_failures"] += 1
            sample.reward = result.reward - (0.0 if sample.action_valid else self.invalid_action_penalty)
            episode.truncated = ended = True
        else:
            sample.action_valid = sample.action_valid and bool(result.info.get("action_valid", True))
            sample.reward = result.reward - (0.0 if sample.action_valid else self.invalid_action_penalty)
            run.observation, run.info = result.observation, result.info
            ended = result.done
        episode.turns.append(sample)
        if not ended and episode.num_turns >= self.max_turns:
            episode.truncated = ended = True
        if ended:
            self._finish(run)

    def _finish(self, run: _Running) -> None:
        """Fill the episode's summary into the episode and all its turns; mark it ended."""
        episode = run.episode
        episode.won = bool(run.info.get("won", False))
        episode.episode_return = sum(t.reward for t in episode.turns)
        score = run.info.get("score")
        episode.score = None if score is None else float(score)
        for turn in episode.turns:
            turn.won = episode.won
            turn.episode_return = episode.episode_return
            turn.episode_truncated = episode.truncated
        run.ended = True

    def _prompt_ids(self, run: _Running, stats: dict[str, float]) -> list[int]:
        """The turn's prompt ids, shortened to ``max_prompt_tokens`` (history first, then the observation; a
        transcript starts over), each shortened prompt counted in ``stats["prompts_shortened"]``."""
        task = run.episode.task
        actions = run.info.get("admissible_actions")
        step = run.episode.num_turns
        started_over = False
        if self.prompt.transcript and step:
            last = run.episode.turns[-1]
            ids = self.prompt.continued_ids(self.tokenizer, last.prompt_ids, last.response_ids, run.observation,
                                            actions)
            if len(ids) <= self.max_prompt_tokens:
                return ids
            started_over = True
        history = run.history
        while True:
            ids = self.prompt.token_ids(self.tokenizer, self.prompt.text(task, run.observation, actions, history, step))
            if len(ids) <= self.max_prompt_tokens or not history:
                break
            history = history[1:]
        cut = len(ids) > self.max_prompt_tokens
        if cut:
            ids = self._cut_observation(task, run.observation, actions, step, len(ids))
        stats["prompts_shortened"] += started_over or cut or len(history) < len(run.history)
        return ids

    def _cut_observation(
        self, task: str, observation: str, actions: list[str] | None, step: int, length: int
    ) -> list[int]:
        """Keep the end of ``observation`` so that the (history-free) prompt fits ``max_prompt_tokens``."""
        obs_ids = self.tokenizer.encode(observation, add_special_tokens=False)
        keep = max(0, len(obs_ids) - (length - self.max_prompt_tokens))
        while keep >= 0:
            kept = TRUNCATION_MARK + self.tokenizer.decode(obs_ids[len(obs_ids) - keep :])
            ids = self.prompt.token_ids(self.tokenizer, self.prompt.text(task, kept, actions, [], step))
            if len(ids) <= self.max_prompt_tokens:
                return ids
            keep -= max(1, len(ids) - self.max_prompt_tokens)
        raise ConfigError(
            f"the prompt without history and observation is longer than model.max_prompt_tokens="
            f"{self.max_prompt_tokens} (task text and admissible actions alone): raise model.max_prompt_tokens"
        )
