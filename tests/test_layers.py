"""The package's layers: the root holds only subpackages (and ``__init__``), no module imports from a layer
above its own (README "How it is built"), and no modules import each other in a circle."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
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


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The package's modules ``path`` imports, at its top or inside a function (a deferred import still closes a
    circle): ``from lightning_epo.a import b`` names the module ``a.b`` where that is one, else ``a``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lightning_epo"):
            found |= {f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                      for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in modules}
    return found & modules


def test_no_modules_import_each_other_in_a_circle():
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {name: imported_modules(path, set(paths)) - {name} for name, path in paths.items()}
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as circle:
        raise AssertionError(f"import circle: {' -> '.join(circle.args[1])}") from None


def test_no_layer_below_training_reaches_up_to_the_lightning_module():
    """``trainer.lightning_module`` is an upward edge no import shows: a DataModule that reads the actor through it
    opens a second route for the weights beside callbacks.WeightSync (the one route)."""
    below = LAYERS[: LAYERS.index("training")]
    reaching = [
        f"{path.relative_to(PACKAGE)}:{number}"
        for path in PACKAGE.rglob("*.py")
        if path.parent != PACKAGE and path.relative_to(PACKAGE).parts[0] in below
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "lightning_module" in line
    ]
    assert not reaching, reaching
