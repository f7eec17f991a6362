"""Non-finite guard: a step with a non-finite loss is skipped and counted; a streak stops the run
before the bad step is checkpointed."""

from __future__ import annotations

import hydra
import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

import lightning_epo.training.module as module_lib
from lightning_epo.callbacks import BetaSchedule, EntropyWindow, RLStepCheckpoint
from lightning_epo.core.errors import ConfigError, UserError
from lightning_epo.runtime.config import validate
from lightning_epo.training.module import TrainingDiverged
from tests.training.test_module import synthetic_batch


class PoisonFrom(L.Callback):
    """Switches the patched objective to a NaN loss from RL step ``step`` on."""

    def __init__(self, step: int) -> None:
        self.step, self.on = step, False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.on = pl_module.rl_step >= self.step


def nan_loss_objective(poison: PoisonFrom):
    """The real objective, plus a *detached* NaN when poisoned: the loss is NaN, the gradients stay finite,
    so only the loss check can catch it."""
    real = module_lib.epo_objective

    def objective(*args, **kwargs):
        loss, terms = real(*args, **kwargs)
        return (loss + torch.tensor(float("nan")) if poison.on else loss), terms

    return objective


def test_a_streak_of_nan_losses_stops_before_checkpointing_the_bad_step(compose_cfg, tmp_path, monkeypatch):
    cfg = compose_cfg("algo=grpo_epo", "total_steps=4", "optim.max_skipped_streak=2", "optim.warmup_ratio=0")
    poison = PoisonFrom(step=2)
    monkeypatch.setattr(module_lib, "epo_objective", nan_loss_objective(poison))
    module = hydra.utils.instantiate(cfg.module)
    checkpoint = RLStepCheckpoint(dirpath=str(tmp_path / "ckpt"), every_n_rl_steps=1)
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
        limit_train_batches=4, callbacks=[EntropyWindow(), BetaSchedule(4), checkpoint, poison],
    )
    batches = [synthetic_batch(500, seed=s) for s in range(4)]
    with pytest.raises(TrainingDiverged, match="2 optimizer steps in a row had a non-finite loss") as failure:
        trainer.fit(module, train_dataloaders=DataLoader(batches, batch_size=None, collate_fn=lambda b: b))
    assert isinstance(failure.value, UserError)  # train.py prints it as one `error: ...` line
    assert f"ckpt_path={tmp_path / 'ckpt' / 'last.ckpt'}" in str(failure.value)  # the newest checkpoint on disk

    # steps 0, 1 trained; steps 2 and 3 were skipped (finite gradients, NaN loss), and step 3 stopped the run
    assert (module.guard.skipped_steps, module.guard.skip_streak) == (2, 2)
    saved = torch.load(tmp_path / "ckpt" / "last.ckpt", map_location="cpu", weights_only=False)
    # the last checkpoint is the last good step (Lightning saves only after an optimizer step, and the
    # aborted step never reaches the checkpoint callback)
    assert saved["rl_state"] == {"rl_step": 2, "skipped_steps": 0, "skip_streak": 0}
    assert all(torch.isfinite(v).all() for v in saved["state_dict"].values() if v.is_floating_point())
    # the skipped steps left the weights alone: the module still holds the checkpointed weights, bit for bit (identity
    # is the point: a skipped step must not write them at all)
    for name, value in module.state_dict().items():
        assert torch.equal(saved["state_dict"][name], value), name


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_max_skipped_streak_must_be_a_positive_integer(compose_cfg, bad):
    with pytest.raises(ConfigError) as failure:
        validate(compose_cfg(f"optim.max_skipped_streak={bad}"))
    assert isinstance(failure.value, UserError)  # train.py prints it as one `error: ...` line
    assert str(failure.value).startswith("optim.max_skipped_streak must be an integer >= 1 or null")
