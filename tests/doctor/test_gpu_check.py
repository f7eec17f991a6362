"""``make gpu-check``: on this machine (no CUDA) one line and exit 1; its cases compose and pass the start checks
as on a GPU machine, the ones that can run on a CPU run there through the same code, and a missing piece is
reported missing, never passed."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM

from lightning_epo.doctor import gpu_check
from lightning_epo.doctor.gpu_check import Case, Result, against_estimate, cases, run_case, shaped_model, table
from lightning_epo.doctor.memory import KNOWN_SHAPES, Shape
from lightning_epo.models.shaped import SHAPES, build_shaped_model
from lightning_epo.runtime.config import check_machine, validate
from tests.integration.test_paper_experiments import shipped


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA")
def test_without_cuda_it_says_so_in_one_line_and_fails():
    done = subprocess.run([sys.executable, "-m", "lightning_epo.doctor.gpu_check"], capture_output=True, text=True,
                          cwd=gpu_check.REPO, timeout=120)
    assert done.returncode == 1
    assert done.stdout.strip().splitlines() == [done.stdout.strip()] and "no CUDA device" in done.stdout


@pytest.fixture
def cuda_machine(monkeypatch):
    """``gpu-check``'s view of a machine with one CUDA GPU (nothing runs on it: the tests stop before any case)."""
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_check.torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(gpu_check.torch.cuda, "get_device_name", lambda index: "a GPU")
    monkeypatch.setattr(gpu_check, "run_case", lambda *a, **k: pytest.fail("a case ran"))


def test_on_a_cuda_machine_without_vllm_it_names_make_setup_vllm_and_fails(cuda_machine, monkeypatch, tmp_path, capsys):
    """No vLLM in this Python and no .venv-vllm: one line, exit 1, before any case (its vLLM rows would only say
    "missing", and the check pass)."""
    find_spec = gpu_check.importlib.util.find_spec
    monkeypatch.setattr(gpu_check.importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else
                        find_spec(name, *a))
    monkeypatch.setattr(gpu_check, "VLLM_PYTHON", tmp_path / "no-python")
    assert gpu_check.main([]) == 1
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert "vLLM is not installed" in line and "make setup-vllm" in line


def test_on_a_cuda_machine_where_vllm_does_not_import_it_says_so_and_fails(cuda_machine, monkeypatch, tmp_path, capsys):
    python = tmp_path / "python"  # a .venv-vllm whose vLLM is broken
    python.write_text("#!/bin/sh\necho 'ImportError: libcudart.so.13: cannot open shared object file' >&2\nexit 1\n")
    python.chmod(0o755)
    monkeypatch.setattr(gpu_check, "vllm_python", lambda: str(python))
    assert gpu_check.main([]) == 1
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert "vLLM does not import" in line and "libcudart.so.13" in line and "make setup-vllm" in line


def test_vllm_cases_get_a_start_up_limit_within_the_checks_budget(monkeypatch):
    """A cold vLLM start (torch.compile, CUDA graphs) gets its own allowance; with 2 GPUs DDP and ZeRO-3 run with a
    vLLM engine per rank and evaluate fewer tasks than ranks."""
    monkeypatch.setattr(gpu_check, "vllm_python", lambda: sys.executable)
    found = {case.name: case for case in cases(2)}
    with_vllm = [case for case in found.values() if case.python == sys.executable and "vllm" in " ".join(
        case.overrides + case.command).lower()]
    assert {case.name for case in with_vllm} == {"tiny, rollout=vllm", "vLLM log-probs (bf16)",
                                                 "tiny, DDP + vLLM, 2 GPUs", "tiny, ZeRO-3 + vLLM, 2 GPUs"}
    for case in with_vllm:
        assert case.timeout_s == gpu_check.CASE_TIMEOUT_S + gpu_check.VLLM_STARTUP_S <= gpu_check.CHECK_BUDGET_S
    for name in ("tiny, DDP + vLLM, 2 GPUs", "tiny, ZeRO-3 + vLLM, 2 GPUs"):
        cfg = shipped(*found[name].overrides)
        assert cfg.trainer.devices == 2 and cfg.env.val_size == 1 < cfg.trainer.devices
        assert cfg.total_steps == cfg.test_every == 2 and cfg.env.eval_splits == ["iid", "ood"]


def test_a_case_runs_under_what_is_left_of_the_budget(tmp_path):
    sleeper = Case("slow", command=("-c", "import time; time.sleep(30)"), timeout_s=600)
    result = run_case(sleeper, tmp_path, budget_s=2)
    assert result.status == "FAILED" and result.note == "still running after 2 s"
    spent = run_case(sleeper, tmp_path, budget_s=0)
    assert spent.status == "FAILED" and spent.note.startswith("not run: the check's") and spent.seconds == 0


@pytest.fixture
def small_shape(tmp_path):
    """Qwen2.5-1.5B's config.json shrunk to a few layers of width 64 and a 4096-token vocabulary."""
    config = json.loads((SHAPES / "qwen2.5-1.5b-instruct" / "config.json").read_text())
    config |= {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
               "num_key_value_heads": 1, "vocab_size": 4096}
    (tmp_path / "small").mkdir()
    (tmp_path / "small" / "config.json").write_text(json.dumps(config))
    return tmp_path / "small"


@pytest.fixture
def small_model(small_shape, tmp_path):
    """The small shape's random-weight model, built on the CPU (before a test pretends to have a GPU)."""
    return build_shaped_model(small_shape, tmp_path / "small-random")


def test_the_shipped_shape_is_qwen2_5_1_5b():
    assert Shape.from_dir(SHAPES / "qwen2.5-1.5b-instruct") == KNOWN_SHAPES["Qwen/Qwen2.5-1.5B-Instruct"]


def test_a_shaped_model_has_its_config_s_shape_and_loads_as_a_model_directory(small_shape, tmp_path):
    model = shaped_model(small_shape, tmp_path)
    assert Shape.from_dir(model) == Shape.from_dir(small_shape)
    assert shaped_model(small_shape, tmp_path) == model  # kept, not rebuilt
    loaded = AutoModelForCausalLM.from_pretrained(model)
    assert loaded.dtype == torch.bfloat16 and loaded.config.vocab_size == 4096


@pytest.mark.parametrize("gpus", [1, 2])
def test_every_train_case_passes_the_start_checks_of_a_gpu_machine(small_model, gpu_machine, gpus):
    runs = [case for case in cases(gpus) if not case.command]
    assert len(runs) == (8 if gpus == 1 else 13)
    for case in runs:
        model = [f"model.name_or_path={small_model}"] if case.shape else []
        cfg = shipped(*case.overrides, *model)
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
                                                          "tiny, ZeRO-2, 2 GPUs", "tiny, ZeRO-3, 2 GPUs",
                                                          "tiny, ZeRO-3 + vLLM, 2 GPUs"}
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


@pytest.mark.slow  # a train.py run of bf16 weights: about a minute where the CPU emulates bf16
def test_the_shaped_case_runs_on_cpu_and_reports_the_doctor_s_estimate(small_shape, tmp_path):
    """Qwen2.5-1.5B's case as shipped but for the trainer, a small shape and 16-token answers: it passes with its
    step's parts and the estimate for its configuration (no peak memory on a CPU to hold against it)."""
    case = next(case for case in cases(1, trainer="trainer=cpu") if case.shape)
    case = replace(case, shape=small_shape, overrides=(*case.overrides, "rollout.max_new_tokens=16"))
    result = run_case(case, tmp_path)
    assert result.status == "passed", result.note
    assert result.figures["perf/step_s"] >= result.figures["perf/gen_s"] > 0 and result.figures["perf/update_s"] > 0
    assert result.figures["estimate_gib"] > 0
    assert result.note.startswith("estimate: ") and result.note.endswith("GiB of 80.0 GiB")


@pytest.mark.parametrize("peak, status", [(1.15, "passed"), (0.85, "passed"), (1.25, "FAILED"), (0.7, "FAILED")])
def test_a_peak_more_than_20_percent_off_the_estimate_fails(small_shape, tmp_path, peak, status):
    """``peak``: the measured peak memory as a multiple of the estimate."""
    case = next(case for case in cases(1) if case.shape)
    overrides = [*case.overrides, f"model.name_or_path={small_shape}"]
    estimated = against_estimate(Result(case, "passed"), overrides, small_shape).figures["estimate_gib"]
    result = against_estimate(Result(case, "passed", figures={"perf/peak_memory_gib": peak * estimated}), overrides,
                              small_shape)
    assert result.status == status and ("more than 20 % off" in result.note) == (status == "FAILED")
