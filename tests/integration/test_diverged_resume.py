"""Lower the lr and resume: a run resumed at an exploding lr stops before saving anything non-finite and names
the checkpoint to resume from, which resumes at the lr the config gives (not the one in the checkpoint)."""

from __future__ import annotations

import math
import re

import pytest
import torch

from lightning_epo.runtime.run import run
from lightning_epo.training.module import TrainingDiverged
from lightning_epo.training.optim import cosine_with_warmup
from tests.integration.test_exact_resume import FAST, logged

STEPS = [*FAST, "total_steps=4", "callbacks.checkpoint.every_n_rl_steps=1"]


def assert_finite(path) -> None:
    saved = torch.load(path, map_location="cpu", weights_only=False)
    assert all(torch.isfinite(v).all() for v in saved["state_dict"].values() if v.is_floating_point()), path
    (window,) = [v for k, v in saved["callbacks"].items() if k.startswith("EntropyWindow")]
    assert all(math.isfinite(v) for v in window["values"]), path


def test_an_exploding_lr_stops_before_saving_and_the_named_checkpoint_resumes(compose_cfg, tmp_path):
    run(compose_cfg(*STEPS, "stop_at_step=2"))
    with pytest.raises(TrainingDiverged) as failure:
        run(compose_cfg(*STEPS, "ckpt_path=last", "optim.actor_lr=1e6"))
    named = re.search(r"ckpt_path=(\S+\.ckpt)", str(failure.value)).group(1)
    checkpoints = sorted((tmp_path / "run" / "checkpoints").iterdir())
    assert named in map(str, checkpoints) and torch.load(named, weights_only=False)["rl_state"]["rl_step"] == 2
    for path in checkpoints:
        assert_finite(path)

    lower = 1e-4  # not the checkpoint's 3e-4: the config's lr wins on resume
    run(compose_cfg(*STEPS, f"ckpt_path={named}", f"optim.actor_lr={lower}"))
    log = logged(tmp_path / "run")
    factor = cosine_with_warmup(4, 0.1, 0.2)
    for step in (2, 3):  # train/lr is logged after the scheduler's step: the next step's lr
        assert log[step]["train/lr"] == pytest.approx(lower * factor(step + 1), rel=1e-6)
    assert torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=False)["rl_state"]["rl_step"] == 4
