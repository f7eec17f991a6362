"""Entry point: ``python train.py [group=option ...] [key=value ...]`` (see conf/config.yaml)."""

from __future__ import annotations

import os

import hydra
from hydra.errors import InstantiationException
from omegaconf import DictConfig


def _user_error(exc: BaseException) -> BaseException | None:
    """The user-facing error behind ``exc`` (Hydra wraps errors raised while instantiating), if any."""
    from lightning_epo.core.errors import UserError

    while exc is not None:
        if isinstance(exc, UserError):
            return exc
        if not isinstance(exc, InstantiationException):
            return None
        exc = exc.__cause__
    return None


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from lightning_epo.core.errors import exit_with_error
    from lightning_epo.runtime.console import setup_console
    from lightning_epo.runtime.preemption import Preemption
    from lightning_epo.runtime.run import run

    setup_console()  # each line once, without the libraries' known-harmless messages
    try:
        with Preemption(cfg.run_dir):  # SIGTERM / Ctrl+C: stop after the current RL step, exit 143 / 130
            run(cfg)
    except Exception as exc:  # one clear line for bad input; a stack trace for everything else
        user_error = _user_error(exc)
        if user_error is None or os.environ.get("LIGHTNING_EPO_TRACEBACK"):
            raise
        exit_with_error(user_error)


if __name__ == "__main__":
    main()
