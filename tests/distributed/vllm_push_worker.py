"""One rank of a 2-process CPU (gloo) ZeRO-3 run with ``rollout=vllm`` over a stubbed ``vllm.LLM``, launched by
``torchrun`` from test_vllm_pushes.py.

    python -m torch.distributed.run --nproc_per_node 2 -m tests.distributed.vllm_push_worker MODEL_DIR OUT_DIR

The project's real ``VLLMEngine`` runs on a stand-in ``vllm`` module (tests/rollout/fake_vllm.py) on a CUDA
platform, so sleep mode is on (level 2: every sleep discards the weights); a push reads every weight, which under
ZeRO-3 gathers each shard, a collective. Two RL steps, each followed by an evaluation of two splits of one episode
each: rank 1 has no episode of either split. Each rank writes its engine's calls, in order, to
``OUT_DIR/pushes-rank<r>.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import lightning_epo.rollout.vllm_engine as vllm_engine
import lightning_epo.runtime.config as start_checks
from tests.distributed.ddp_worker import compose_cfg
from tests.rollout.fake_vllm import FakeLLM, fake_vllm_module

PUSHES = [
    "debug=fast", "logger=csv", "~callbacks.progress_bar", "rollout=vllm", "test_every=1", "env.val_size=1",
    "trainer=deepspeed_stage_3", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.precision=32-true",
]


class RecordedLLM(FakeLLM):
    started: list[RecordedLLM] = []  # this process's engines

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        RecordedLLM.started.append(self)


def main(model_dir: str, out_dir: str) -> None:
    from lightning_epo.runtime.run import run

    vllm_engine.import_vllm = lambda: fake_vllm_module(RecordedLLM, device_type="cuda")
    start_checks.vllm_installed = lambda: True
    run(compose_cfg(model_dir, f"{out_dir}/run", *PUSHES))
    (llm,) = RecordedLLM.started
    Path(out_dir, f"pushes-rank{os.environ['RANK']}.json").write_text(json.dumps(llm.calls))


if __name__ == "__main__":
    main(*sys.argv[1:])
