"""Divergence caught before it is saved: parameters that turn non-finite or explode in an RL step, and
non-finite old-policy outputs, stop the run before that step is checkpointed, with a message that names
the checkpoint to resume from; the entropy window never takes a non-finite entry."""

from __future__ import annotations

import math

import hydra
import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

import lightning_epo.training.module as module_lib
from lightning_epo.callbacks import BetaSchedule, EntropyWindow, RLStepCheckpoint
from lightning_epo.training.module import TrainingDiverged
from tests.training.test_module import synthetic_batch


class CorruptFrom(L.Callback):
    """From RL step ``step`` on, applies ``corrupt`` to the actor's parameters after every optimizer step
    (a post-step hook of the optimizer: inside the RL step, as a diverging update would)."""

    def __init__(self, step: int, corrupt) -> None:
        self.step, self.corrupt, self.on = step, corrupt, False

    def on_train_start(self, trainer, pl_module) -> None:
        trainer.optimizers[0].register_step_post_hook(self._after_step)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.on = pl_module.rl_step >= self.step
        self.module = pl_module

    @torch.no_grad()
    def _after_step(self, optimizer, args, kwargs) -> None:
        if self.on:
            for param in self.module.actor.parameters():
                self.corrupt(param)


def nan_first_element(param: torch.Tensor) -> None:
    param.view(-1)[0] = float("nan")


def times_three(param: torch.Tensor) -> None:
    param.mul_(3.0)


def fit(compose_cfg, tmp_path, callback: L.Callback, *overrides: str, steps: int = 4, window=None) -> None:
    """Fit ``steps`` RL steps of grpo_epo on synthetic batches with ``window`` (a fresh one by default) and
    a checkpoint after every step, in ``tmp_path / "ckpt"``."""
    cfg = compose_cfg("algo=grpo_epo", f"total_steps={steps}", "optim.warmup_ratio=0", *overrides)
    module = hydra.utils.instantiate(cfg.module)
    window = window if window is not None else EntropyWindow()
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
        limit_train_batches=steps,
        callbacks=[window, BetaSchedule(steps), RLStepCheckpoint(dirpath=str(tmp_path / "ckpt")), callback],
    )
    batches = [synthetic_batch(500, seed=s) for s in range(steps)]
    trainer.fit(module, train_dataloaders=DataLoader(batches, batch_size=None, collate_fn=lambda b: b))


def assert_finite_checkpoint(path, rl_step: int) -> None:
    """``path`` is the checkpoint of ``rl_step`` completed steps: finite weights and a finite entropy window."""
    saved = torch.load(path, map_location="cpu", weights_only=False)
    assert saved["rl_state"]["rl_step"] == rl_step
    assert all(torch.isfinite(v).all() for v in saved["state_dict"].values() if v.is_floating_point())
    (window,) = [v for k, v in saved["callbacks"].items() if k.startswith("EntropyWindow")]
    assert len(window["values"]) == rl_step and all(math.isfinite(v) for v in window["values"])


@pytest.mark.parametrize("corrupt, reason", [(nan_first_element, "not finite"), (times_three, "grew")])
def test_parameters_that_diverge_in_a_step_stop_before_it_is_checkpointed(compose_cfg, tmp_path, corrupt, reason):
    with pytest.raises(TrainingDiverged, match=f"parameter norm {reason}") as failure:
        fit(compose_cfg, tmp_path, CorruptFrom(2, corrupt))
    last = tmp_path / "ckpt" / "last.ckpt"
    assert f"ckpt_path={last}" in str(failure.value) and "\n" not in str(failure.value)
    assert_finite_checkpoint(last, rl_step=2)  # the last good step; the bad step 2 was never saved


def test_growth_limit_null_still_stops_non_finite_parameters(compose_cfg, tmp_path):
    fit(compose_cfg, tmp_path, CorruptFrom(1, times_three), "optim.max_param_norm_growth=null", steps=2)
    with pytest.raises(TrainingDiverged, match="parameter norm not finite"):
        fit(compose_cfg, tmp_path, CorruptFrom(1, nan_first_element), "optim.max_param_norm_growth=null", steps=2)


def test_a_run_that_diverges_before_any_checkpoint_says_so(compose_cfg, tmp_path):
    with pytest.raises(TrainingDiverged, match="no checkpoint exists yet"):
        fit(compose_cfg, tmp_path, CorruptFrom(0, nan_first_element))
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").iterdir())


class NanEntropyFrom(L.Callback):
    """Makes the actor's token entropies NaN from RL step ``step`` on: those of the old-policy pass (no grad) and of
    the update's forward, which gives the old policy's entropies of the rows it reaches before its first optimizer
    step (training/micro_batches.py's ``update_fills``)."""

    def __init__(self, step: int, monkeypatch) -> None:
        self.step, self.on = step, False
        real = module_lib.actor_token_outputs

        def outputs(*args, **kwargs):
            logprob, entropy = real(*args, **kwargs)
            return logprob, torch.full_like(entropy, float("nan")) if self.on else entropy

        monkeypatch.setattr(module_lib, "actor_token_outputs", outputs)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.on = pl_module.rl_step >= self.step


@pytest.mark.parametrize("mini_batches", [1, 2])  # the update's forward gives every row's old entropies, or half
def test_non_finite_old_policy_entropies_never_reach_the_entropy_window(compose_cfg, tmp_path, monkeypatch,
                                                                         mini_batches):
    window = EntropyWindow()
    with pytest.raises(TrainingDiverged, match="the old policy gave") as failure:
        fit(compose_cfg, tmp_path, NanEntropyFrom(2, monkeypatch), f"algo.mini_batches={mini_batches}", window=window)
    assert f"ckpt_path={tmp_path / 'ckpt' / 'last.ckpt'}" in str(failure.value)
    assert len(window.values) == 2 and all(math.isfinite(v) for v in window.values)
    assert_finite_checkpoint(tmp_path / "ckpt" / "last.ckpt", rl_step=2)
