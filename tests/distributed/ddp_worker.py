"""One rank of a 2-process CPU (gloo) DDP run, launched by ``torchrun`` from test_ddp.py.

    python -m torch.distributed.run --nproc_per_node 2 -m tests.distributed.ddp_worker MODEL_DIR OUT_DIR

Two jobs, one launch (process start-up dominates on a small CPU):

- ``fixed``: two RL steps of the module on fixed synthetic episodes, rank r holding half of the
  trajectories (whole GRPO groups), with SGD; rank r saves its parameters and logged metrics to
  ``OUT_DIR/fixed-<algo>-rank<r>.pt`` for comparison with one process holding all trajectories
  (:func:`train_fixed` with ``world=1``, run by the test itself).
- ``gridworld``: the real loop (``trainer=ddp trainer.accelerator=cpu trainer.devices=2``): each rank
  collects its own gridworld episodes; :class:`RankRecorder` saves what each rank saw and holds.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, open_dict
from torch.utils.data import DataLoader

from lightning_epo.callbacks import BetaSchedule, EntropyWindow
from lightning_epo.models.weights import hf_weights
from lightning_epo.rollout.batch import RolloutBatch, collate_episodes
from tests.training.test_module import synthetic_batch, with_history, with_prompt_prefix

REPO = Path(__file__).resolve().parents[2]
TRAJECTORIES = 8  # synthetic trajectories per RL step, all ranks together (groups of 2)
ALGOS = ("ppo_epo", "grpo_epo")
SGD = [
    "optim.optimizer._target_=torch.optim.SGD", "~optim.optimizer.betas", "~optim.optimizer.weight_decay",
    "optim.actor_lr=0.05", "optim.critic_lr=0.05", "optim.grad_clip=1e9", "optim.warmup_ratio=0", "total_steps=2",
    "algo.micro_batch_tokens=null", "algo.micro_batch_size=3",
]
SHARED_PREFIX = [5, 6, 7, 8, 9, 10]


def compose_cfg(model_dir: str, run_dir: str, *overrides: str) -> DictConfig:
    """``conf/config.yaml`` with overrides (as tests/conftest.py's ``compose_cfg``)."""
    with initialize_config_dir(str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["~experiment", f"model.name_or_path={model_dir}", f"run_dir={run_dir}", *overrides])
    with open_dict(cfg):
        cfg.pop("hydra", None)
    return cfg


def rank_batches(rank: int, world: int, prefixed: bool = False) -> list[RolloutBatch]:
    """Rank ``rank``'s share of two fixed RL steps: a contiguous slice of whole trajectories (and groups).
    ``prefixed``: the prompts of rank 0's steps and of the other ranks' first step start with the same
    :data:`SHARED_PREFIX` (``model.shared_prefix``: then the ranks share a prefix at step 0, only rank 0 at step 1),
    and every turn's prompt carries its episode's earlier turns (``model.fold_turns``)."""
    share = TRAJECTORIES // world
    batches = []
    for seed in (1, 2):
        episodes = synthetic_batch(500, seed=seed, trajectories=TRAJECTORIES).episodes[rank * share : (rank + 1) * share]
        if prefixed:
            with_history(episodes)
        if prefixed and (rank == 0 or seed == 1):
            with_prompt_prefix(episodes, SHARED_PREFIX)
        batches.append(collate_episodes(episodes, 0, {"train/reward": 1.0}))
    return batches


def train_fixed(cfg: DictConfig, world: int, strategy: Any = None, prefixed: bool = False,
                batches: list[RolloutBatch] | None = None, initial: dict[str, torch.Tensor] | None = None
                ) -> dict[str, Any]:
    """Two RL steps on this rank's fixed batches (:func:`rank_batches`, or ``batches``); returns the (full, gathered)
    parameters, metrics and the entropy window. ``strategy``: Lightning's (default: ``ddp`` on several processes);
    ``initial``: the module's parameters to start from (a recorded run's, :class:`RankRecorder`)."""
    rank = int(os.environ.get("RANK", 0))  # torchrun's; the process group starts inside fit
    L.seed_everything(0)
    module = hydra.utils.instantiate(cfg.module)
    window = EntropyWindow(cfg.algo.epo.window)
    batches = batches or rank_batches(rank, world, prefixed)
    trainer = L.Trainer(
        accelerator="cpu", devices=world, strategy=strategy or ("ddp" if world > 1 else "auto"), max_epochs=1,
        logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        limit_train_batches=len(batches),
        use_distributed_sampler=False,  # the batches are this rank's already
        callbacks=[window, BetaSchedule(cfg.total_steps, cfg.algo.epo.beta),
                   *([StartFrom(initial)] if initial is not None else [])],
    )
    trainer.fit(module, train_dataloaders=DataLoader(batches, batch_size=None, collate_fn=lambda b: b))
    return {
        "params": dict(hf_weights(module)),
        "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
        "window": list(window.values),
    }


class StartFrom(L.Callback):
    """Loads the module's parameters (a recorded run's, by name) when fit starts, before the first RL step."""

    def __init__(self, params: dict[str, torch.Tensor]) -> None:
        self.params = params

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        with torch.no_grad():
            for name, param in pl_module.named_parameters():
                param.copy_(self.params[name])


class RankRecorder(L.Callback):
    """Saves, per rank, the entropy window, the H̄ handed to the module, the first prompt of every episode this rank
    played, its episodes of every RL step, the parameters at fit's start and end, the number of episodes it played
    of each evaluation split, and whether the process group still answers a collective once the DataModule closed
    its engines (``group_after_close``: the all-ranks sum of ``rank + 1``, or the error), to
    ``out_dir/<name>-rank<r>.pt``."""

    def __init__(self, out_dir: str, name: str = "gridworld") -> None:
        self.out_dir, self.name = Path(out_dir), name
        self.entropy_refs: list[float | None] = []
        self.first_prompts: list[list[list[int]]] = []
        self.episodes: list[list[Any]] = []
        self.evaluated: list[tuple[str, int]] = []
        self.record: dict[str, Any] = {}

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.record["initial_params"] = {n: p.detach().clone() for n, p in pl_module.named_parameters()}

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.entropy_refs.append(pl_module.step_inputs.entropy_ref)
        episodes = pl_module.step_report.rollout.episodes
        self.first_prompts.append([ep.turns[0].prompt_ids for ep in episodes])
        self.episodes.append(list(episodes))

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        self.evaluated.append((batch.split, len(batch.episodes)))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        (window,) = [c for c in trainer.callbacks if isinstance(c, EntropyWindow)]
        self.record |= {
            "window": list(window.values),
            "entropy_refs": self.entropy_refs,
            "first_prompts": self.first_prompts,
            "episodes": self.episodes,
            "evaluated": self.evaluated,
            "params": {n: p.detach().clone() for n, p in pl_module.named_parameters()},
        }

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """After the DataModule's teardown (Lightning calls it first), which closed the engines."""
        if stage != "fit":
            return
        try:
            answer = torch.tensor(float(trainer.global_rank + 1))
            torch.distributed.all_reduce(answer)
            self.record["group_after_close"] = float(answer)
        except (RuntimeError, ValueError) as error:  # a destroyed or uninitialised default group
            self.record["group_after_close"] = repr(error)
        torch.save(self.record, self.out_dir / f"{self.name}-rank{trainer.global_rank}.pt")


def main(model_dir: str, out_dir: str) -> None:
    from lightning_epo.runtime.run import run

    for algo in ALGOS:
        result = train_fixed(compose_cfg(model_dir, f"{out_dir}/fixed", f"algo={algo}", *SGD), world=2)
        torch.save(result, Path(out_dir) / f"fixed-{algo}-rank{os.environ['RANK']}.pt")
    run(compose_cfg(
        model_dir, f"{out_dir}/gridworld", "debug=fast", "logger=csv", "~callbacks.progress_bar", "test_every=1000",
        "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.precision=32-true",
        f"+callbacks.record={{_target_: tests.distributed.ddp_worker.RankRecorder, out_dir: '{out_dir}'}}",
    ))


if __name__ == "__main__":
    main(*sys.argv[1:])
