"""``make gpu-check``: on this machine (no CUDA) one line and exit 1; its cases compose and pass the start checks
as on a GPU machine, the ones that can run on a CPU run there through the same code, and a missing piece is
reported missing, never passed."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from lightning_epo.doctor import gpu_check
from lightning_epo.doctor.gpu_check import Case, cases, run_case, table
from lightning_epo.runtime.config import check_machine, validate
from tests.integration.test_paper_experiments import shipped


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA")
def test_without_cuda_it_says_so_in_one_line_and_fails():
    done = subprocess.run([sys.executable, "-m", "lightning_epo.doctor.gpu_check"], capture_output=True, text=True,
                          cwd=gpu_check.REPO, timeout=120)
    assert done.returncode == 1
    assert done.stdout.strip().splitlines() == [done.stdout.strip()] and "no CUDA device" in done.stdout


@pytest.mark.parametrize("gpus", [1, 2])
def test_every_train_case_passes_the_start_checks_of_a_gpu_machine(gpu_machine, gpus):
    runs = [case for case in cases(gpus) if not case.command]
    assert len(runs) == (7 if gpus == 1 else 10)
    for case in runs:
        cfg = shipped(*case.overrides)
        validate(cfg)
        check_machine(cfg)
        assert cfg.trainer.accelerator == "gpu" and cfg.total_steps == 2


def test_a_missing_piece_is_reported_missing(monkeypatch, tmp_path):
    """Without DeepSpeed and vLLM (and SmolLM2's files) their cases are ``missing`` with what installs them."""
    find_spec = gpu_check.importlib.util.find_spec
    monkeypatch.setattr(gpu_check.importlib.util, "find_spec",
                        lambda name, *a: None if name in ("deepspeed", "vllm") else find_spec(name, *a))
    monkeypatch.setattr(gpu_check, "VLLM_PYTHON", tmp_path / "no-python")
    monkeypatch.setattr(gpu_check, "SMOLLM2", gpu_check.REPO / "data" / "no-such-model")
    results = [run_case(case, tmp_path) for case in cases(2) if case.missing]
    missing = {r.case.name: r.note for r in results}
    assert all(r.status == "missing" for r in results)
    assert {name for name in missing if "ZeRO" in name} == {"tiny, ZeRO-2, 1 GPU", "tiny, ZeRO-3, 1 GPU",
                                                          "tiny, ZeRO-2, 2 GPUs", "tiny, ZeRO-3, 2 GPUs"}
    assert "make setup-vllm" in missing["tiny, rollout=vllm"] and "make smollm2" in missing["SmolLM2-135M"]
    assert "| tiny, ZeRO-3, 2 GPUs | missing |" in table(results)


@pytest.mark.slow  # two train.py runs, ~1-3 min: make test stays under 30 minutes (test_train.py runs the same path)
def test_the_single_gpu_cases_run_on_cpu_and_report_their_figures(tmp_path):
    """The tiny model's cases (plain, LoRA) with ``trainer=cpu`` in place of ``trainer=gpu``:
    each passes and reports generation tokens/s and update time (peak GPU memory exists on CUDA only)."""
    for case in cases(1, trainer="trainer=cpu")[:2]:
        result = run_case(case, tmp_path)
        assert result.status == "passed", result.note
        assert result.figures["perf/gen_tokens_per_s"] > 0 and result.figures["perf/update_s"] > 0
        assert "perf/peak_memory_gib" not in result.figures


def test_a_failing_case_is_failed_with_its_last_line(tmp_path):
    result = run_case(Case("broken", ("model.dtype=float64",)), tmp_path)
    assert result.status == "FAILED" and "model.dtype" in result.note


def test_a_failing_case_reports_its_error_not_the_lines_after_it(tmp_path):
    """Hydra's HYDRA_FULL_ERROR hint and NCCL's exit warning come after the error (gpu-check, 2026-11-25: every
    failure read "Set the environment variable HYDRA_FULL_ERROR=1" or "destroy_process_group() was not called")."""
    script = ("import sys; print('Traceback (most recent call last):', file=sys.stderr); "
              "print(\"RuntimeError: Expected a 'cuda' device type for generator\", file=sys.stderr); "
              "print('Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.', file=sys.stderr); "
              "print('[rank0]: Warning: destroy_process_group() was not called', file=sys.stderr); sys.exit(1)")
    result = run_case(Case("broken", command=("-c", script)), tmp_path)
    assert result.status == "FAILED"
    assert "RuntimeError: Expected a 'cuda' device type for generator" in result.note
