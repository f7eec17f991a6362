"""``python -m lightning_epo.doctor``: one line per component, true of this machine; a planted problem is the one
FAIL line, naming its fix, and a non-zero exit."""

from __future__ import annotations

import contextlib
import io
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lightning_epo.doctor import checks
from lightning_epo.doctor.__main__ import main
from lightning_epo.doctor.memory import KNOWN_SHAPES, Shape
from lightning_epo.training import allocator

COMPONENTS = ["python", "torch", "transformers", "lightning", "deepspeed", "vllm", "peft", "java", "alfworld data",
              "model", "memory", "allocator", "disk", "config"]


def doctor(*overrides: str) -> tuple[int, list[str]]:
    """Exit status and output lines of ``python -m lightning_epo.doctor OVERRIDES`` (its ``main``, in this process:
    a new interpreter spends most of half a minute importing the libraries)."""
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        code = main(list(overrides))
    return code, output.getvalue().splitlines()


def by_component(lines: list[str]) -> dict[str, tuple[str, str]]:
    """``{component: (status, detail)}`` of the component lines (every line but the verdict)."""
    parsed = {}
    for line in lines[:-1]:
        status, rest = line[:4].strip(), line[6:]
        component = next(c for c in COMPONENTS if rest.startswith(c))
        parsed[component] = (status, rest[len(component):].strip())
    return parsed


def test_reports_this_machine_truthfully():
    code, lines = doctor()
    report = by_component(lines)
    assert code == 0 and lines[-1] == "this machine can run it"
    assert list(report) == COMPONENTS and len(lines) == len(COMPONENTS) + 1  # one line each
    assert report["python"] == ("ok", f"{platform.python_version()} ({sys.executable})")
    torch_status, torch_detail = report["torch"]
    assert torch_detail.startswith(torch.__version__)
    assert ("no CUDA device" in torch_detail or "CPU build" in torch_detail) != torch.cuda.is_available()
    assert torch.backends.cpu.get_cpu_capability() in torch_detail
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    assert report["java"][1].split()[0] in java  # the version java itself prints
    assert report["deepspeed"][0] == "ok" and "0.19.8" in report["deepspeed"][1]
    assert report["model"][0] == "ok" and "safetensors" in report["model"][1]


def test_a_missing_model_directory_is_the_one_failure(tmp_path):
    code, lines = doctor(f"model.name_or_path={tmp_path / 'no-such-model'}", "model.build_if_missing=false")
    failures = {c: d for c, (s, d) in by_component(lines).items() if s == "FAIL"}
    assert code == 1 and list(failures) == ["model"]
    assert "does not exist: set model.name_or_path" in failures["model"]


def test_missing_java_fails_sciworld_only(tmp_path, monkeypatch):
    """Java off PATH (an empty folder as PATH, no JAVA_HOME): a ScienceWorld run fails on it, a gridworld run not."""
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    code, lines = doctor("env=sciworld")
    failures = {c: d for c, (s, d) in by_component(lines).items() if s == "FAIL"}
    assert code == 1 and list(failures) == ["java"]
    assert "openjdk-17" in failures["java"]
    code, lines = doctor()
    assert code == 0 and by_component(lines)["java"][0] == "-"


def test_a_vllm_built_for_another_torch_fails_a_vllm_run(monkeypatch, capsys):
    """vLLM pins the torch it was built for: another installed torch is one FAIL line for ``rollout=vllm`` (a warning
    for a run that does not use it)."""
    monkeypatch.setattr(checks, "vllm_distribution", lambda: "vllm")
    monkeypatch.setattr(checks, "installed_version", lambda name: "0.33.0" if name == "vllm" else
                        checks.importlib.metadata.version(name))
    monkeypatch.setattr(checks, "vllm_torch_pin", lambda distribution: "2.14.0")
    find_spec = checks.importlib.util.find_spec
    monkeypatch.setattr(checks.importlib.util, "find_spec",  # as if vLLM were installed here
                        lambda name, *args: object() if name == "vllm" else find_spec(name, *args))
    assert main(["rollout=vllm"]) == 1
    failures = [line for line in capsys.readouterr().out.splitlines() if line.startswith("FAIL")]
    assert len(failures) == 1 and failures[0].split()[1] == "vllm"
    assert f"built for torch 2.14.0) but torch {torch.__version__} is installed" in failures[0]
    assert "make setup-vllm" in failures[0]
    assert main([]) == 0
    assert "warn  vllm" in capsys.readouterr().out


def test_a_long_cpu_run_on_glibc_s_malloc_is_told_how_to_run_on_jemalloc(monkeypatch, tmp_path):
    """glibc's heap grows over a long CPU run (docs/host_allocator_cpu.md): past 10 RL steps the line names the
    preload, the library's path where one is installed; a shorter run, a jemalloc run and a GPU run are not told."""
    monkeypatch.setattr(allocator, "current", lambda: "glibc")
    monkeypatch.setattr(allocator, "find_jemalloc", lambda: None)
    status, detail = by_component(doctor("total_steps=11")[1])["allocator"]
    assert status == "ok" and detail.startswith("glibc: over 11 RL steps") and "apt install libjemalloc2" in detail
    assert by_component(doctor("total_steps=10")[1])["allocator"] == ("ok", "glibc")
    monkeypatch.setattr(allocator, "find_jemalloc", lambda: tmp_path / "libjemalloc.so.2")
    assert f"LD_PRELOAD={tmp_path / 'libjemalloc.so.2'}" in by_component(doctor("total_steps=24")[1])["allocator"][1]
    monkeypatch.setattr(allocator, "current", lambda: "jemalloc")
    assert by_component(doctor("total_steps=24")[1])["allocator"] == ("ok", "jemalloc")
    monkeypatch.setattr(allocator, "current", lambda: "glibc")
    assert by_component(doctor("trainer=gpu", "total_steps=24")[1])["allocator"][0] == "-"


@pytest.mark.parametrize("name", sorted(KNOWN_SHAPES))
def test_known_shapes_give_the_published_parameter_counts(name):
    """The shapes the estimate uses for hub models before their files are here: Qwen2.5's model cards give
    1.54B, 3.09B and 7.61B parameters (biases and norms, left out, are under 0.1 %)."""
    published = {"Qwen/Qwen2.5-1.5B-Instruct": 1.54e9, "Qwen/Qwen2.5-3B-Instruct": 3.09e9,
                 "Qwen/Qwen2.5-7B-Instruct": 7.61e9}[name]
    assert KNOWN_SHAPES[name].parameters == pytest.approx(published, rel=0.005)


def test_a_built_model_gives_its_own_shape(tiny_model_path):
    """The estimate reads the model's own config.json: the tiny model's parameter count is torch's."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    weights = sum(p.numel() for n, p in model.named_parameters() if "norm" not in n and "bias" not in n)
    assert Shape.from_dir(Path(tiny_model_path)).parameters == weights


@pytest.mark.vllm
def test_the_vllm_environment_passes_a_vllm_run(vllm_env):
    """In .venv-vllm: vLLM imports and was built for the torch installed beside it."""
    code, lines = doctor("rollout=vllm")
    status, detail = by_component(lines)["vllm"]
    assert code == 0 and status == "ok" and f"built for torch {torch.__version__.split('+')[0]}" in detail


def test_a_lora_run_s_weights_are_its_bf16_base_and_its_float32_adapters():
    """The adapters' own weights are held beside the base (PEFT keeps them float32): 1.5B at r 32, 0.14 GiB that the
    estimate left out while the H200's measured peak was 11 % above it (docs/measurements.md, 2026-11-28)."""
    from lightning_epo.doctor.checks import compose_run
    from lightning_epo.doctor.memory import estimate

    shape = KNOWN_SHAPES["Qwen/Qwen2.5-1.5B-Instruct"]
    cfg, _ = compose_run(["model=qwen2.5-1.5b", "algo=grpo_epo", "trainer=gpu", "model.lora.r=32"])
    parts = estimate(shape, cfg, 1, 80 * 2**30, on_gpu=True).parts
    assert parts["weights"] == shape.parameters * 2 + shape.lora_parameters(32) * 4
    assert parts["gradients"] == shape.lora_parameters(32) * 4


def test_an_evaluation_engine_of_its_own_is_counted_beside_the_training_engine():
    """A warm start trains on the expert's episodes (no model) and evaluates the model with an engine of its own
    (``data.val_engine``): that engine's memory is the run's too. The SmolLM2 ScienceWorld warm start, its
    evaluation on vLLM, peaked at 13.0 GB resident where the estimate left out the engine (docs/measurements.md)."""
    from lightning_epo.doctor.checks import compose_run
    from lightning_epo.doctor.memory import GIB, estimate

    shape = Shape.from_config({"hidden_size": 576, "num_hidden_layers": 30, "vocab_size": 49152,
                               "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3,
                               "tie_word_embeddings": True})  # SmolLM2-135M's config.json
    vllm = ["data.val_engine._target_=lightning_epo.rollout.vllm_engine.VLLMEngine", "+data.val_engine.dtype=bfloat16",
            "+data.val_engine.kv_cache_gib=2"]
    cfg, _ = compose_run(["experiment=gridworld_sft", *vllm])
    assert cfg.rollout.engine._target_.endswith("ExpertEngine")
    parts = estimate(shape, cfg, 1, 24 * GIB, on_gpu=False).parts
    assert parts["engine"] == shape.parameters * 2 + 2 * GIB
