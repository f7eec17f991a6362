"""One rank of a 2-process CPU (gloo) run with LoRA, launched by ``torchrun`` from test_lora_distributed.py.

    python -m torch.distributed.run --nproc_per_node 2 -m tests.distributed.lora_worker MODEL_DIR OUT_DIR

ddp_worker's two RL steps on fixed episodes (SGD, several micro-batches) with LoRA on the actor and the critic and
the KL term (reference: the adapter disabled), under DDP, ZeRO-2 and ZeRO-3, saved as
``OUT_DIR/lora-<strategy>-rank<r>.pt``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from tests.distributed.ddp_worker import SGD, compose_cfg, train_fixed
from tests.distributed.deepspeed_worker import STRATEGIES, strategy

LORA = ["algo=ppo_epo", "model.lora.r=4", "model.lora.critic=true", "algo.kl_coef=0.05", *SGD]


def main(model_dir: str, out_dir: str) -> None:
    cfg = compose_cfg(model_dir, f"{out_dir}/fixed", *LORA)
    for name in STRATEGIES:
        result = train_fixed(cfg, world=2, strategy=strategy(name, cfg.optim.grad_clip))
        torch.save(result, Path(out_dir) / f"lora-{name}-rank{os.environ['RANK']}.pt")


if __name__ == "__main__":
    main(*sys.argv[1:])
