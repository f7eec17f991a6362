"""One rank of a 2-process CPU (gloo) DeepSpeed run, launched by ``torchrun`` from test_deepspeed.py.

    python -m torch.distributed.run --nproc_per_node 2 -m tests.distributed.deepspeed_worker MODEL_DIR OUT_DIR

Every DeepSpeed job of the tests, in one launch (process start-up dominates on a small CPU):

- ``fixed-<strategy>``: ddp_worker's two RL steps on fixed episodes (SGD, several micro-batches per
  mini-batch, ranks with different micro-batch counts) under DDP, ZeRO-2 and ZeRO-3, saved as
  ``OUT_DIR/fixed-<strategy>-rank<r>.pt``.
- ``prefixed-<strategy>``: the same on prompts that start alike and carry their episode's earlier turns
  (``rank_batches(prefixed=True)``), plain under DDP and with ``model.shared_prefix=true model.fold_turns=true``
  under ZeRO-3.
- ``nonfinite-zero<stage>``: the same with a NaN loss (finite gradients) at every step, saved likewise.
- ``resume``: gridworld under ZeRO-3 with ``rollout=expert``: two RL steps with ``export_policy=true``
  (``OUT_DIR/full``), and one step, stopped, then resumed with ``ckpt_path=last`` (``OUT_DIR/resumed``).
- ``validated``: one step of the same after an evaluation before fit (``val_at_start=true``), and ``mode=eval`` of
  ``full``'s checkpoint; each run's actor forward hooks at the start of fit in ``OUT_DIR/<run>-hooks-rank<r>.txt``,
  the evaluated actor's weights in ``OUT_DIR/evaluated-actor.pt``.
- ``died``: two steps of the same, evaluated after each (``test_every=1``), the run dying in the evaluation after
  its first step, then resumed with ``ckpt_path=last``: the evaluation it did not finish plays before fit.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import lightning as L
import torch

import lightning_epo.training.module as module_lib
from lightning_epo.models.weights import hf_weights
from lightning_epo.training.strategies import deepspeed_strategy
from tests.distributed.ddp_worker import SGD, compose_cfg, train_fixed
from tests.integration.test_resume_evaluation import CRASH
from tests.training.test_nonfinite_guard import PoisonFrom, nan_loss_objective

STRATEGIES = ("ddp", "zero2", "zero3")
# 4 rows a micro-batch: several a step (24 rows a rank), and a short ZeRO-3 trace. DeepSpeed records the step's
# submodule order and, releasing each submodule, scans it ahead for reuse up to stage3_max_reuse_distance (1e9)
# elements: every one of the tiny model's, so the scan grows with the trace's square (2 rows a micro-batch made the
# uninterrupted run's second step 52 s instead of 13 s, 2026-12-01)
RESUME = [
    "debug=fast", "logger=csv", "~callbacks.progress_bar", "test_every=1000", "rollout=expert",
    "algo.micro_batch_tokens=null", "algo.micro_batch_size=4",
    "trainer=deepspeed_stage_3", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.precision=32-true",
]


def strategy(name: str, grad_clip: float):
    """Lightning's ``ddp``, or the project's DeepSpeed strategy on CPU (``zero2`` / ``zero3``)."""
    return "ddp" if name == "ddp" else deepspeed_strategy(int(name[-1]), "32-true", grad_clip, accelerator="cpu")


class ForwardHookCount(L.Callback):
    """Writes the number of forward (pre-)hooks on the actor's modules when fit starts (ZeRO-3 gathers shards in
    them: one engine's hooks, or two)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        hooks = sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in pl_module.actor.modules())
        Path(self.path).write_text(str(hooks))


class ActorWeights(L.Callback):
    """Saves the actor's full weights (gathered from the shards) when an evaluation starts."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        weights = dict(hf_weights(pl_module.actor))
        if trainer.is_global_zero:
            torch.save(weights, self.path)


def count_hooks(out_dir: str, run: str) -> list[str]:
    target = f"{__name__}.{ForwardHookCount.__name__}"
    path = f"{out_dir}/{run}-hooks-rank{os.environ['RANK']}.txt"
    return [f"+callbacks.hooks._target_={target}", f"+callbacks.hooks.path={path}"]


def main(model_dir: str, out_dir: str) -> None:
    from lightning_epo.runtime.run import run

    out, rank = Path(out_dir), os.environ["RANK"]
    cfg = compose_cfg(model_dir, f"{out_dir}/fixed", "algo=ppo_epo", *SGD)
    for name in STRATEGIES:
        result = train_fixed(cfg, world=2, strategy=strategy(name, cfg.optim.grad_clip))
        torch.save(result, out / f"fixed-{name}-rank{rank}.pt")
    plain = compose_cfg(model_dir, f"{out_dir}/fixed", "algo=ppo_epo", *SGD, "model.shared_prefix=false",
                        "model.fold_turns=false")
    shared = compose_cfg(model_dir, f"{out_dir}/fixed", "algo=ppo_epo", *SGD, "model.shared_prefix=true",
                         "model.fold_turns=true")
    sharings, choose = [], module_lib.EPOModule._sharing  # what each micro-batch shared, saved with the run
    module_lib.EPOModule._sharing = lambda self, mb: sharings.append(choose(self, mb)) or sharings[-1]
    for name, name_cfg in (("ddp", plain), ("zero3", shared)):
        result = train_fixed(name_cfg, world=2, strategy=strategy(name, cfg.optim.grad_clip), prefixed=True)
        prefixes = [sharing.prefix for sharing in sharings]
        folded = [0 if s.computed is None else len(s.source) - len(s.computed) for s in sharings]
        torch.save({**result, "prefixes": prefixes, "folded": folded}, out / f"prefixed-{name}-rank{rank}.pt")
    module_lib.EPOModule._sharing = choose
    real_objective, poison = module_lib.epo_objective, PoisonFrom(step=0)
    poison.on = True  # at every step (not registered as a callback)
    module_lib.epo_objective = nan_loss_objective(poison)
    for name in ("zero2", "zero3"):
        result = train_fixed(cfg, world=2, strategy=strategy(name, cfg.optim.grad_clip))
        torch.save(result, out / f"nonfinite-{name}-rank{rank}.pt")
    module_lib.epo_objective = real_objective
    run(compose_cfg(model_dir, f"{out_dir}/full", *RESUME, "export_policy=true", *count_hooks(out_dir, "full")))
    run(compose_cfg(model_dir, f"{out_dir}/resumed", *RESUME, "stop_at_step=1"))
    run(compose_cfg(model_dir, f"{out_dir}/resumed", *RESUME, "ckpt_path=last"))
    validated = [*RESUME, "val_at_start=true", "total_steps=1", *count_hooks(out_dir, "validated")]
    run(compose_cfg(model_dir, f"{out_dir}/validated", *validated))
    died = [*RESUME, "test_every=1", "total_steps=2", "callbacks.checkpoint.every_n_rl_steps=1"]
    try:
        run(compose_cfg(model_dir, f"{out_dir}/died", *died, f"+callbacks.crash._target_={CRASH}",
                        "+callbacks.crash.at_step=1"))
        raise AssertionError("the run did not die in its evaluation")
    except RuntimeError as error:
        assert "a crash in the evaluation" in str(error), error
    run(compose_cfg(model_dir, f"{out_dir}/died", *died, "ckpt_path=last", *count_hooks(out_dir, "died")))
    weights = f"+callbacks.weights._target_={__name__}.{ActorWeights.__name__}"
    run(compose_cfg(model_dir, f"{out_dir}/full", *RESUME, "mode=eval", "ckpt_path=last", weights,
                    f"+callbacks.weights.path={out_dir}/evaluated-actor.pt"))


if __name__ == "__main__":
    main(*sys.argv[1:])
