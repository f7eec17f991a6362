"""Every shipped experiment, and the comparison script's algorithm list on its experiment, passes the start checks
(an experiment inherits another's settings: a change to one must not break the other)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lightning_epo.config import validate

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = sorted(path.stem for path in (REPO / "conf" / "experiment").glob("*.yaml"))
COMPARISON_ALGOS = re.search(
    r'ALGOS=\$\{ALGOS:-"([^"]+)"\}', (REPO / "scripts" / "gridworld_comparison.sh").read_text()
).group(1).split()


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_passes_the_start_checks(compose_cfg, experiment):
    validate(compose_cfg(f"experiment={experiment}"))


@pytest.mark.parametrize("algo", COMPARISON_ALGOS)
def test_comparison_algorithms_pass_the_start_checks_on_gridworld_long(compose_cfg, algo):
    validate(compose_cfg("experiment=gridworld_long", f"algo={algo}"))
