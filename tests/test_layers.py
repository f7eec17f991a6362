"""The package's layers: the root holds only subpackages (and ``__init__``), and no module imports from a layer
above its own (README "How it is built")."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "lightning_epo"
LAYERS = ["core", "algos", "envs", "models", "rollout", "training", "callbacks", "runtime", "reports", "doctor"]


def imported_layers(path: Path) -> list[tuple[int, str]]:
    """``(line, layer)`` of every ``lightning_epo.<layer>...`` import in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        modules = [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
        modules += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
        found += [(node.lineno, m.split(".")[1]) for m in modules if m.startswith("lightning_epo.")]
    return found


def test_the_package_root_holds_only_the_layers():
    assert sorted(p.name for p in PACKAGE.iterdir() if p.name != "__pycache__") == sorted([*LAYERS, "__init__.py"])


def test_no_module_imports_from_a_layer_above_its_own():
    upward = [
        f"{path.relative_to(PACKAGE)}:{line} imports lightning_epo.{layer}"
        for path in PACKAGE.rglob("*.py")
        if path.parent != PACKAGE
        for line, layer in imported_layers(path)
        if LAYERS.index(layer) > LAYERS.index(path.relative_to(PACKAGE).parts[0])
    ]
    assert not upward, upward
