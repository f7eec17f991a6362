"""LoRA under DDP and DeepSpeed ZeRO-2/3 on CPU (gloo, 2 processes): the single-process update, adapters only.

One torchrun launch (``lora_worker.py``) runs every job; the tests read its outputs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.distributed.ddp_worker import compose_cfg, train_fixed
from tests.distributed.lora_worker import LORA
from tests.distributed.test_ddp import assert_same_update, launch, load

LOSSES = ("loss/policy", "loss/entropy", "loss/value", "loss/kl", "loss/smooth", "loss/total")


@pytest.fixture(scope="module")
def lora_outputs(tiny_model_path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("lora")
    launch("lora_worker", tiny_model_path, out, timeout=600)
    return out


def test_ddp_makes_the_single_process_update_and_only_adapters_move(lora_outputs, tiny_model_path, tmp_path):
    single = train_fixed(compose_cfg(tiny_model_path, str(tmp_path), *LORA), world=1)
    for rank in (0, 1):
        assert_same_update(load(lora_outputs / f"lora-ddp-rank{rank}.pt"), single, LOSSES)
    initial = train_fixed(compose_cfg(tiny_model_path, str(tmp_path), *LORA, "optim.actor_lr=0", "optim.critic_lr=0"),
                          world=1)["params"]
    # a frozen parameter is never written (and lr 0 writes one unchanged): it keeps its loaded bits exactly
    moved = {n for n, p in single["params"].items() if not torch.equal(p, initial[n])}
    assert moved and all("lora_" in n or n.startswith("critic.head.") for n in moved)


@pytest.mark.deepspeed
@pytest.mark.parametrize("stage", ["zero2", "zero3"])
def test_zero_makes_the_ddp_update_with_lora(lora_outputs, stage):
    ddp = load(lora_outputs / "lora-ddp-rank0.pt")
    for rank in (0, 1):
        assert_same_update(load(lora_outputs / f"lora-{stage}-rank{rank}.pt"), ddp, LOSSES)
