"""``python train.py trainer=...`` on a machine that cannot run it: one `error:` line naming the fix."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.integration.train_command import last_line, train


@pytest.mark.skipif(
    torch.cuda.is_available() and importlib.util.find_spec("deepspeed") is not None,
    reason="this machine can run DeepSpeed",
)
def test_deepspeed_trainer_without_cuda_or_deepspeed_fails_with_one_line(tmp_path):
    result = train("trainer=deepspeed_stage_2", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    line = last_line(result.stderr)
    assert line.startswith("error: trainer=deepspeed_stage_2 needs ")
    assert "pip install -r requirements.txt" in line and "trainer.accelerator=cpu" in line
