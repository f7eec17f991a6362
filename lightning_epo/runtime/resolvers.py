"""OmegaConf resolvers the configs use; :func:`register_resolvers` must run before the config is resolved
(``run.py`` calls it first thing)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from omegaconf import DictConfig, OmegaConf


def run_id(run_dir: str) -> str:
    """``${run_id:DIR}``: a wandb run id that is a pure function of the run directory (16 hex digits of
    its absolute path's SHA-1), so ``ckpt_path=last`` in the same directory resumes the same wandb run."""
    return hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]


def run_config(*, _root_: DictConfig) -> dict:
    """``${run_config:}``: the whole run config, resolved, as plain containers, for logging it (WandbSetup).
    The ``callbacks`` group is left out: the entry that asks for this value sits inside it."""
    kept = [key for key in _root_ if key != "callbacks"]
    return OmegaConf.to_container(OmegaConf.masked_copy(_root_, kept), resolve=True)


def native_bf16(if_native: str, otherwise: str) -> str:
    """``${native_bf16:A,B}``: ``A`` where this CPU computes bf16 natively (AVX-512 BF16 or AMX, what the doctor
    reports as "bf16 native"), else ``B``: a recipe's setting that is faster in bf16 only where bf16 is not emulated."""
    from lightning_epo.runtime.config import cpu_computes_bf16  # at call time: torch and the config checks load late

    return if_native if cpu_computes_bf16() else otherwise


def if_bf16(precision: str, if_bf16: str, otherwise: str) -> str:
    """``${if_bf16:${trainer.precision},A,B}``: ``A`` where the trainer computes in bf16 (``bf16-mixed``,
    ``bf16-true``), else ``B``: a setting that follows the precision (one override of it changes both)."""
    return if_bf16 if "bf16" in str(precision) else otherwise


def if_file(path: str, if_there: str, otherwise: str) -> str:
    """``${if_file:PATH,A,B}``: ``A`` where the file ``PATH`` (relative: from the repository root) exists, else ``B``:
    e.g. a recipe named with the step that builds its model (``make smollm2``) where it is not built yet."""
    file = Path(path) if Path(path).is_absolute() else Path(__file__).resolve().parents[2] / path
    return if_there if file.is_file() else otherwise


def register_resolvers() -> None:
    """Register ``${run_id:DIR}``, ``${run_config:}``, ``${native_bf16:A,B}``, ``${if_bf16:P,A,B}`` and
    ``${if_file:PATH,A,B}`` (idempotent)."""
    for name, resolver in (("run_id", run_id), ("run_config", run_config), ("native_bf16", native_bf16),
                           ("if_bf16", if_bf16), ("if_file", if_file)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)
