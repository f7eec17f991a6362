"""The environment a policy directory was trained on: ``trained_on.json`` beside its weights, written by the policy
export (``export_policy=true``; the shipped data/tiny_gridworld has one), so that a run can say at start that its
model learned another environment (a smoke run of the loop, not an agent of this one)."""

from __future__ import annotations

import json
from pathlib import Path

TRAINED_ON = "trained_on.json"


def write_trained_on(path: str | Path, env: str) -> None:
    """Record in the model directory ``path`` that its policy was trained on ``env`` (``env.name``)."""
    (Path(path) / TRAINED_ON).write_text(json.dumps({"env": env}) + "\n")


def trained_on(path: str | Path) -> str | None:
    """The ``env.name`` the policy in ``path`` was trained on; None where nothing is recorded (a pretrained model, the
    random tiny model, a hub id)."""
    record = Path(path) / TRAINED_ON
    return json.loads(record.read_text()).get("env") if record.is_file() else None


def other_environment_line(path: str | Path, env: str, recipes: str) -> str | None:
    """One line where the policy in ``path`` was trained on another environment than ``env``, naming ``env``'s own
    recipes (``env.recipes``); None where it was trained on ``env`` or nothing is recorded."""
    origin = trained_on(path)
    if origin is None or origin == env:
        return None
    return (f"model {path} was trained on {origin}, not {env}: this run is a smoke run of the training loop, not a "
            f"{env} agent; {env}'s recipes: {recipes}")
