"""The rollout DataModule: owns the environment pool, the generation engine and the task sampler,
and streams one RL step's episodes per batch (Lightning's ``reinforce_learn_ppo`` pattern)."""

from __future__ import annotations

import logging
import random
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from lightning_epo.core.seeding import evaluation_seeded
from lightning_epo.envs.base import EnvPool, Task, TaskSuite
from lightning_epo.models.loading import load_tokenizer
from lightning_epo.rollout.batch import RolloutBatch, collate_episodes
from lightning_epo.rollout.collector import EpisodeCollector
from lightning_epo.rollout.engine import GenerationEngine, SamplingParams
from lightning_epo.rollout.eval_progress import EvalProgress
from lightning_epo.rollout.group_filter import keep_mixed_groups, mixed_share
from lightning_epo.rollout.progress_log import rollout_done_line, rollout_stats

log = logging.getLogger(__name__)


@dataclass
class EvalBatch:
    """Finished evaluation episodes of one split on this rank, the seconds their collection took and its counters
    (:class:`~lightning_epo.rollout.collector.Rollout`'s ``stats``)."""

    split: str
    episodes: list
    wall_s: float = 0.0
    stats: dict[str, float] = field(default_factory=dict)


TASK_ORDERS = ("random", "shuffled")  # data.task_order


class TaskSampler:
    """Training tasks of RL step k on rank r are a pure function of ``(seed, k, r)``, so the whole sampler
    state is ``step`` (saved in the checkpoint). A GRPO group is ``group_size`` rollouts of one task
    (same task and variation).

    ``order``: ``random`` draws each group's task uniformly, with replacement, from a stream of ``(seed, k, r)``;
    ``shuffled`` walks through the tasks in passes, each pass a permutation drawn from ``(seed, pass)``, and step k
    on rank r of ``world`` ranks takes the ``groups_per_step`` places after ``(k * world + r) * groups_per_step``:
    every task once per pass, no task on two ranks within a pass, the same stream for every rank count."""

    def __init__(self, tasks: list[Task], seed: int, groups_per_step: int, group_size: int,
                 order: str = "random") -> None:
        if order not in TASK_ORDERS:
            raise ValueError(f"order={order!r} is not one of: {', '.join(TASK_ORDERS)}")
        self.tasks, self.seed, self.order = tasks, seed, order
        self.groups_per_step, self.group_size = groups_per_step, group_size
        self.step = 0

    def draw(self, rank: int = 0, world: int = 1) -> tuple[list[Task], list[int]]:
        if self.order == "shuffled":
            picked = self._next_in_passes((self.step * world + rank) * self.groups_per_step)
        else:
            rng = random.Random(f"{self.seed}/{self.step}/{rank}")
            picked = [rng.choice(self.tasks) for _ in range(self.groups_per_step)]
        self.step += 1
        tasks = [t for t in picked for _ in range(self.group_size)]
        return tasks, [g for g in range(self.groups_per_step) for _ in range(self.group_size)]

    def _next_in_passes(self, start: int) -> list[Task]:
        """Places ``start ..`` of the endless sequence of passes, each a permutation of the tasks."""
        passes: dict[int, list[Task]] = {}
        picked = []
        for place in range(start, start + self.groups_per_step):
            number, index = divmod(place, len(self.tasks))
            if number not in passes:
                passes[number] = list(self.tasks)
                random.Random(f"{self.seed}/pass/{number}").shuffle(passes[number])
            picked.append(passes[number][index])
        return picked


def validation_sample(tasks: list[Task], size: int | None, seed: int) -> list[Task]:
    """``size`` tasks of a split, spread over task families round-robin, shuffled inside each family by
    ``seed`` only: the same episodes for every run and algorithm with that seed. ``None``: all tasks.
    A ``size`` above the split's task count plays every task ``size // len(tasks)`` times (each a new
    sampled episode, for a tighter estimate) plus a round-robin sample of the rest."""
    if size is None or not tasks:
        return list(tasks)
    if size >= len(tasks):
        passes, rest = divmod(size, len(tasks))
        return list(tasks) * passes + validation_sample(tasks, rest, seed)
    families: dict[str, list[Task]] = defaultdict(list)
    for t in tasks:
        families[t.name].append(t)
    for name in sorted(families):
        random.Random(f"{seed}/{name}").shuffle(families[name])
    order = [families[n] for n in sorted(families)]
    picked: list[Task] = []
    depth = 0
    while len(picked) < size:
        picked.extend(f[depth] for f in order if depth < len(f))
        depth += 1
    return picked[:size]


class _Stream(IterableDataset):
    """Calls ``produce`` for every item: an endless training stream or a one-shot evaluation stream."""

    def __init__(self, produce: Callable[[], Any], once: bool) -> None:
        self.produce, self.once = produce, once

    def __iter__(self) -> Iterator[Any]:
        yield self.produce()
        while not self.once:
            yield self.produce()


def _as_is(item: Any) -> Any:
    return item


class RolloutDataModule(L.LightningDataModule):
    """Streams rollouts: a training batch = ``groups_per_step * group_size`` episodes (one RL step; with
    ``oversample = m``, the ``groups_per_step`` kept of ``m`` times as many collected, mixed-outcome groups
    first: lightning_epo/rollout/group_filter.py); evaluation = ``val_size`` episodes per split, a
    deterministic sample for the seed."""

    def __init__(
        self,
        suite: TaskSuite,
        pool: Callable[..., EnvPool],
        engine: Callable[..., GenerationEngine],
        model: Any,
        collector: Callable[..., EpisodeCollector],
        episodes_per_step: int,
        group_size: int,
        val_size: int | None,
        eval_splits: list[str],
        train_sampling: dict[str, Any],
        val_sampling: dict[str, Any],
        seed: int = 0,
        val_engine: Callable[..., GenerationEngine] | None = None,
        oversample: int = 1,
        task_order: str = "random",
    ) -> None:
        super().__init__()
        self.suite, self.make_pool, self.make_engine, self.model_cfg = suite, pool, engine, model
        self.make_val_engine = val_engine  # None: evaluate with the training engine
        self.make_collector = collector
        self.eval_splits, self.val_size, self.seed = list(eval_splits), val_size, seed
        self.train_sampling, self.val_sampling = SamplingParams(**train_sampling), SamplingParams(**val_sampling)
        self.groups_per_step, self.oversample = episodes_per_step // group_size, oversample
        self.sampler = TaskSampler([], seed, self.groups_per_step * oversample, group_size, task_order)
        self.engine: GenerationEngine | None = None
        self.val_engine: GenerationEngine | None = None
        self.pool: EnvPool | None = None
        self.collector: EpisodeCollector | None = None
        self.val_collector: EpisodeCollector | None = None
        self.policy: Callable[[], torch.nn.Module] | None = None  # the actor, handed over by callbacks.WeightSync
        self._weights_bound = False
        self._evaluation_weights: torch.nn.Module | None = None  # the actor an evaluation engine of its own awaits
        # called with an EvalProgress after each evaluation turn that ended episodes (the progress bar registers at setup)
        self.eval_listeners: list[Callable[[EvalProgress], None]] = []
        self.fit_follows = False  # the next trainer.validate is followed by fit: keep engines and environments open

    def setup(self, stage: str) -> None:
        if stage == "fit":
            self.sampler.tasks = self.suite.tasks("train")
        if self.collector is not None:  # kept open from an evaluation before fit (``fit_follows``)
            return
        for split in self.eval_splits:
            self.suite.tasks(split)  # fail at start, with the suite's message, on an empty or unknown split
        self.tokenizer = load_tokenizer(self.model_cfg)
        self.engine = self.make_engine(tokenizer=self.tokenizer)
        self.val_engine = self.make_val_engine(tokenizer=self.tokenizer) if self.make_val_engine else self.engine
        if self.val_engine is not self.engine:
            self.val_engine.release_memory()  # training comes first: an engine of its own sleeps until it evaluates
        self.pool = self.make_pool(suite=self.suite)
        self.collector = self._collector(self.engine)
        self.val_collector = self._collector(self.val_engine) if self.make_val_engine else self.collector

    def _collector(self, engine: GenerationEngine) -> EpisodeCollector:
        return self.make_collector(pool=self.pool, engine=engine, tokenizer=self.tokenizer)

    def _engines(self) -> list[GenerationEngine]:
        return [e for e in dict.fromkeys((self.engine, self.val_engine)) if e is not None]

    def sync_weights(self, actor: torch.nn.Module) -> None:
        """Make the training engine sample from ``actor``'s weights now, and a separate evaluation engine when it next
        evaluates: pushed after every update, a vLLM evaluation engine would copy weights it does not sample from
        and, on a GPU, wake from its sleep and hold its memory through training."""
        self.engine.sync_weights(actor)
        self._evaluation_weights = actor if self.val_engine is not self.engine else None
        self._weights_bound = True

    def _bind_weights_once(self) -> None:
        """Before the first collection, bind the engines to :attr:`policy` (WeightSync's one route: it hands the actor
        over at setup, as Lightning fetches an evaluation's first batch before any hook of the loop runs). Without a
        trainer (a test, a script) the caller binds the engines."""
        if self._weights_bound or self.trainer is None:
            return
        if self.policy is None:
            raise RuntimeError("the generation engines have no policy to sample from: the WeightSync callback hands "
                               "them the actor; keep callbacks.weight_sync")
        self.sync_weights(self.policy())

    def teardown(self, stage: str) -> None:
        """Close the environments and the engines, but not after an evaluation that ``fit`` follows
        (``fit_follows``, set by the run for ``val_at_start``): fit reuses them rather than start them again (a vLLM
        engine, a pool of JVMs)."""
        if stage == "validate" and self.fit_follows:
            return
        if self.pool is not None:
            self.pool.close()
        for engine in self._engines():
            engine.close()
        self.pool = self.engine = self.val_engine = self.collector = self.val_collector = None
        self._weights_bound, self._evaluation_weights = False, None

    def on_exception(self, exception: BaseException) -> None:
        """A run stopped by an exception (a preemption's included) closes its environments too: Lightning calls
        ``teardown`` only after a run that ends normally."""
        self.teardown("fit")

    def _rank(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def next_train_batch(self) -> RolloutBatch:
        rank, world = self._rank()
        tasks, groups = self.sampler.draw(rank, world)
        step = self.sampler.step - 1
        if rank == 0:  # collection can take minutes: say it is alive
            log.info("step %d: collecting %d episodes ...", step, len(tasks))
        start = time.perf_counter()
        self._bind_weights_once()
        self.engine.before_collection()
        rollout = self.collector.collect(tasks, groups, self.train_sampling)
        self.engine.release_memory()  # the update needs the memory next
        wall_s = time.perf_counter() - start
        stats = rollout_stats(rollout, wall_s=wall_s)  # over every collected episode: the policy's own level
        if rank == 0:
            log.info(rollout_done_line(step, rollout, stats))
        episodes = rollout.episodes
        if self.sampler.group_size > 1:  # over every collected group: how many carry a success signal
            stats["train/mixed_groups"] = mixed_share(episodes)
        if self.oversample > 1:
            episodes = keep_mixed_groups(episodes, self.groups_per_step)
        return collate_episodes(episodes, self.tokenizer.pad_token_id, stats)

    def eval_batch(self, split: str) -> EvalBatch:
        rank, world = self._rank()
        tasks = validation_sample(self.suite.tasks(split), self.val_size, self.seed)
        if rank == 0:  # an evaluation can take minutes: say what it plays (SuccessReport logs what it measured)
            rl_steps = self.sampler.step  # one draw per RL step, restored with a checkpoint
            log.info("evaluation at RL step %d: playing %d %s episodes ...", rl_steps, len(tasks), split)
        tasks = tasks[rank::world]
        start = time.perf_counter()
        self._bind_weights_once()
        if self._evaluation_weights is not None:
            self.val_engine.sync_weights(self._evaluation_weights)
            self._evaluation_weights = None
        self.val_engine.before_collection()  # every rank, with or without episodes of this split (engine.py)
        progress = EvalProgress(split, len(tasks), self.sampler.step, self.eval_listeners if rank == 0 else [],
                                log_every_s=30.0 if rank == 0 else float("inf"))
        with evaluation_seeded(self.seed, self.sampler.step, split, rank):
            rollout = self.val_collector.collect(
                tasks, list(range(len(tasks))), self.val_sampling, on_turn=progress.turn_done,
                should_stop=self._preempted,
            )
        self.val_engine.release_memory()
        return EvalBatch(split, rollout.episodes, wall_s=time.perf_counter() - start, stats=rollout.stats)

    def _preempted(self) -> bool:
        """Whether a preemption signal arrived (lightning_epo/runtime/preemption.py sets Lightning's flag): an
        evaluation then stops between two turns, its episodes discarded (the resumed run plays it from its start)."""
        return self.trainer is not None and self.trainer.received_sigterm

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_Stream(self.next_train_batch, once=False), batch_size=None, collate_fn=_as_is)

    def val_dataloader(self) -> list[DataLoader]:
        return [
            DataLoader(_Stream(lambda s=split: self.eval_batch(s), once=True), batch_size=None, collate_fn=_as_is)
            for split in self.eval_splits
        ]

    def state_dict(self) -> dict[str, Any]:
        return {"sampler_step": self.sampler.step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.sampler.step = int(state_dict["sampler_step"])
