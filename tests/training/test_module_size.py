"""The update stays readable on a screen: the LightningModule at most 250 lines, no function of the training layer
over 40 (micro-batch planning, the divergence guard, the step's targets, metrics and timing have modules of their
own)."""

from __future__ import annotations

import ast
from pathlib import Path

TRAINING = Path(__file__).resolve().parents[2] / "lightning_epo" / "training"


def definitions(path: Path, kind: type) -> dict[str, int]:
    """``name: lines`` of every ``kind`` (class or function) defined in ``path``."""
    return {node.name: node.end_lineno - node.lineno + 1 for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, kind)}


def test_the_lightning_module_fits_in_250_lines():
    assert definitions(TRAINING / "module.py", ast.ClassDef)["EPOModule"] <= 250


def test_no_function_of_the_training_layer_is_over_40_lines():
    long = {f"{path.name}:{name}": lines for path in TRAINING.glob("*.py")
            for name, lines in definitions(path, ast.FunctionDef).items() if lines > 40}
    assert not long, long
