"""Model directories written atomically: the tiny model's build and the policy export (``export_policy=true``).

A reader (another rank, a later run's ``from_pretrained``) never sees a half-written directory: everything
goes into a private temporary sibling that is renamed to the final path in one step.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from lightning_epo.models.lora import is_lora
from lightning_epo.models.trained_on import write_trained_on
from lightning_epo.models.weights import hf_weights

ADAPTER_DIR = "adapter"  # a LoRA actor's adapter, inside its exported model directory


@contextmanager
def staged_directory(path: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling of ``path`` to write into; when the block ends without error it is renamed
    to ``path`` (if another process published ``path`` first, that directory is kept). Removed in any case."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}-", suffix=".partial", dir=path.parent))
    try:
        yield staging
        _publish(staging, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _publish(staging: Path, path: Path) -> None:
    """Rename ``staging`` to ``path`` in one step; if another process got there first, keep its directory."""
    staging.chmod(0o755)  # mkdtemp (and safetensors' own temp file) are private; a checkpoint is not
    for entry in staging.rglob("*"):
        entry.chmod(0o755 if entry.is_dir() else 0o644)
    try:
        staging.rename(path)
    except OSError:
        if not (path / "config.json").is_file():
            raise


def export_policy(
    actor: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    path: str | Path,
    state_dict: Mapping[str, torch.Tensor] | None = None,
    env: str | None = None,
) -> Path:
    """Save ``actor`` (safetensors, config, generation config) and ``tokenizer`` as one Hugging Face model
    directory at ``path``, loadable with ``model.name_or_path=path``; ``state_dict`` overrides the actor's own
    tensors (full weights gathered from ZeRO-3 shards). An existing ``path`` is replaced.

    A LoRA actor is saved twice: merged (base + adapters, ``state_dict`` or :func:`hf_weights`) as the model
    directory, and its adapter alone in ``path/adapter`` (``PeftModel.from_pretrained(base, path / "adapter")``;
    under ZeRO-3 the caller gathers the adapters' shards around this call). ``env``: the environment it was trained
    on, recorded beside the weights (lightning_epo/models/trained_on.py)."""
    path = Path(path)
    if path.exists():
        shutil.rmtree(path)
    with staged_directory(path) as staging:
        if is_lora(actor):
            actor.save_pretrained(staging / ADAPTER_DIR)
            state_dict = state_dict if state_dict is not None else dict(hf_weights(actor))
            actor = actor.get_base_model()
        actor.save_pretrained(staging, state_dict=dict(state_dict) if state_dict is not None else None)
        tokenizer.save_pretrained(staging)
        if env is not None:
            write_trained_on(staging, env)
    return path
