"""``python -m lightning_epo.doctor [group=option ...] [key=value ...]`` (the overrides ``train.py`` takes)."""

from __future__ import annotations

import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, open_dict

from lightning_epo.doctor.checks import FAIL, REPO, all_checks
from lightning_epo.runtime.engine_choice import choose_engine
from lightning_epo.runtime.resolvers import register_resolvers


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


def main(argv: list[str]) -> int:
    cfg, run_dir = compose_run(argv)
    lines = all_checks(cfg, run_dir)
    for line in lines:
        print(line, flush=True)
    failed = [line for line in lines if line.status == FAIL]
    print(f"{len(failed)} problem(s): fix the FAIL lines above" if failed else "this machine can run it")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
