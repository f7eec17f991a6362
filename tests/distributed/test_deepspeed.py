"""DeepSpeed ZeRO-2/3 on CPU (gloo, 2 processes launched by torchrun): the DDP update, uneven micro-batch counts,
exact resume, the exported policy, and skipped non-finite steps.

One torchrun launch (``deepspeed_worker.py``) runs every DeepSpeed job of this file; the tests read its outputs.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.distributed.ddp_worker import SHARED_PREFIX, rank_batches
from tests.distributed.test_ddp import assert_actor_moved, assert_same_update, launch, load

pytestmark = pytest.mark.deepspeed


@pytest.fixture(scope="module")
def ds_outputs(tiny_model_path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("deepspeed")
    launch("deepspeed_worker", tiny_model_path, out, timeout=600)
    return out


def consolidated(run_dir: Path) -> dict[str, torch.Tensor]:
    """The fp32 weights of the run's ZeRO checkpoint ``last.ckpt``, consolidated by DeepSpeed's own tool."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return get_fp32_state_dict_from_zero_checkpoint(str(run_dir / "checkpoints" / "last.ckpt"))


def losses_at(run_dir: Path, step: int) -> dict[str, float]:
    rows = list(csv.DictReader((run_dir / "csv" / "metrics.csv").open()))
    (row,) = [r for r in rows if r["step"] == str(step) and r["loss/total"]]
    return {k: float(v) for k, v in row.items() if k.startswith("loss/") and v}


@pytest.mark.parametrize("stage", ["zero2", "zero3"])
def test_zero_makes_the_ddp_update(ds_outputs, tiny_model_path, stage):
    """Two RL steps with SGD, several micro-batches per mini-batch (actor and critic): every parameter (gathered
    from the shards) and every logged loss equal DDP's. ZeRO-3 accumulating only the last micro-batch's gradient
    (or a critic head left at Linear's default initialisation) fails here."""
    ddp = load(ds_outputs / "fixed-ddp-rank0.pt")
    for rank in (0, 1):
        zero = load(ds_outputs / f"fixed-{stage}-rank{rank}.pt")
        assert_same_update(zero, ddp, ("loss/policy", "loss/entropy", "loss/value", "loss/smooth", "loss/total"))
    assert_actor_moved(ddp, tiny_model_path)


def test_zero3_with_a_shared_prefix_makes_the_ddp_update(ds_outputs):
    """``model.shared_prefix=true model.fold_turns=true`` under ZeRO-3 against plain DDP on prompts that start alike
    and carry their episode's history: the same update.
    At step 1 only rank 0's rows share a prefix: a rank sharing alone would run the decoder twice per micro-batch
    against the other's once, and the ZeRO-3 all-gathers of the two ranks would not pair up."""
    ddp = load(ds_outputs / "prefixed-ddp-rank0.pt")
    assert not any(ddp["prefixes"])  # the DDP reference is the plain forward
    for rank in (0, 1):
        zero = load(ds_outputs / f"prefixed-zero3-rank{rank}.pt")
        assert_same_update(zero, ddp, ("loss/policy", "loss/entropy", "loss/value", "loss/smooth", "loss/total"))
        used = zero["prefixes"][len(ddp["prefixes"]):]
        assert max(used) >= len(SHARED_PREFIX) and 0 in used  # shared at step 0, not where only rank 0 could
        assert sum(zero["folded"][len(ddp["folded"]):]) > 0  # and earlier turns were read from later ones


def test_ranks_with_different_micro_batch_counts_finish(ds_outputs):
    """Every ZeRO-3 forward all-gathers the shards: a rank with fewer micro-batches (here in the old-policy pass
    and the update of the first step) must still run as many passes, or the launch hangs past its timeout."""
    counts = [[math.ceil(len(b) / 3) for b in rank_batches(rank, 2)] for rank in (0, 1)]  # micro_batch_size=3 (SGD)
    assert counts[0][0] != counts[1][0]
    for rank in (0, 1):
        assert load(ds_outputs / f"fixed-zero3-rank{rank}.pt")["window"]  # both RL steps ran to the end


def test_resume_at_step_1_equals_the_uninterrupted_run(ds_outputs):
    """ZeRO-3, gridworld: stop after one RL step, resume with ``ckpt_path=last``: the same losses at step 1 and the
    same weights, optimizer state and all, as two uninterrupted steps."""
    full, resumed = ds_outputs / "full", ds_outputs / "resumed"
    assert losses_at(resumed, 1) == pytest.approx(losses_at(full, 1), rel=1e-6)
    assert losses_at(resumed, 0) == pytest.approx(losses_at(full, 0), rel=1e-6)
    expected, got = consolidated(full), consolidated(resumed)
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, rtol=1e-6, atol=1e-7, msg=name)


def test_exported_policy_under_zero3_equals_the_consolidated_weights(ds_outputs, tiny_model_path):
    """``export_policy=true`` gathers the shards one parameter at a time: the same tensors as DeepSpeed's own
    consolidation of the run's last checkpoint."""
    exported = load_file(str(ds_outputs / "full" / "policy" / "model.safetensors"))
    actor = {n.removeprefix("actor."): v for n, v in consolidated(ds_outputs / "full").items() if n.startswith("actor.")}
    assert actor.keys() - exported.keys() == {"lm_head.weight"}  # tied to the embeddings: saved once
    # identity is the point: both gather copies of the same shards, nothing is computed on them
    assert torch.equal(actor["lm_head.weight"], exported["model.embed_tokens.weight"])
    for name, value in exported.items():
        assert torch.equal(value, actor[name]), name
    initial = load_file(str(Path(tiny_model_path) / "model.safetensors"))
    assert any(not torch.equal(exported[n], p) for n, p in initial.items())  # trained weights, not the start


@pytest.mark.parametrize("stage", ["zero2", "zero3"])
def test_nonfinite_step_is_skipped_and_counted(ds_outputs, tiny_model_path, stage):
    """A NaN loss (with finite gradients, so only the module's own check can catch it) at both RL steps: both
    optimizer steps are skipped and counted, and the actor keeps its initial weights."""
    for rank in (0, 1):
        result = load(ds_outputs / f"nonfinite-{stage}-rank{rank}.pt")
        assert result["metrics"]["train/skipped_steps"] == 2
        initial = load_file(str(Path(tiny_model_path) / "model.safetensors"))
        for name, value in initial.items():  # skipped steps never write the weights: their loaded bits, exactly
            assert torch.equal(result["params"][f"actor.{name}"], value), name


def test_evaluation_before_fit_leaves_one_engine_on_the_model(ds_outputs):
    """ZeRO-3, ``val_at_start=true``: the evaluation's inference engine (built by ``trainer.validate``) is gone when
    fit builds its training engine, so each module carries the hooks of one engine, as in a run without the
    evaluation (with both engines' hooks every forward gathers the shards twice). The evaluation itself ran."""
    for rank in (0, 1):
        plain = int((ds_outputs / f"full-hooks-rank{rank}.txt").read_text())
        validated = int((ds_outputs / f"validated-hooks-rank{rank}.txt").read_text())
        assert plain > 0 and validated == plain
    rows = list(csv.DictReader((ds_outputs / "validated" / "csv" / "metrics.csv").open()))
    assert any(row["step"] == "0" and row.get("val/iid/success") for row in rows)
    assert any(row.get("loss/total") for row in rows)


def test_a_zero3_run_that_died_in_an_evaluation_plays_it_before_fit_when_resumed(ds_outputs):
    """ZeRO-3, a run dead in the evaluation after its first step (test_every=1) and resumed: the evaluation plays
    from the sharded checkpoint before fit (``trainer.validate`` with it), fit then trains the second step on one
    engine's hooks, and both evaluations are logged, at the steps of the RL steps they follow (0 and 1)."""
    for rank in (0, 1):
        plain = int((ds_outputs / f"full-hooks-rank{rank}.txt").read_text())
        assert int((ds_outputs / f"died-hooks-rank{rank}.txt").read_text()) == plain
    rows = list(csv.DictReader((ds_outputs / "died" / "csv" / "metrics.csv").open()))
    assert sorted({row["step"] for row in rows if row.get("val/iid/success")}) == ["0", "1"]
    assert sorted({row["step"] for row in rows if row.get("loss/total")}) == ["0", "1"]


def test_mode_eval_of_a_zero3_checkpoint_evaluates_its_weights(ds_outputs):
    """``mode=eval ckpt_path=last`` on a ZeRO-3 run loads its sharded checkpoint into DeepSpeed's inference engine
    (on CPU, at the rank's own device index): the evaluated actor holds the checkpoint's trained weights, and
    eval.json is written."""
    evaluated = load(ds_outputs / "evaluated-actor.pt")
    trained = {n.removeprefix("actor."): v for n, v in consolidated(ds_outputs / "full").items() if n.startswith("actor.")}
    assert evaluated.keys() == trained.keys() - {"lm_head.weight"}  # tied to the embeddings
    for name, value in evaluated.items():  # loaded copies of the checkpoint's tensors: identity is the point
        assert torch.equal(value, trained[name]), name
    results = json.loads((ds_outputs / "full" / "eval.json").read_text())
    assert {"val/iid/success", "val/ood/success"} <= results.keys()
