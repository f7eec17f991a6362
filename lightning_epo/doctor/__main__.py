"""``python -m lightning_epo.doctor [group=option ...] [key=value ...]`` (the overrides ``train.py`` takes)."""

from __future__ import annotations

import sys

from lightning_epo.doctor.checks import FAIL, all_checks, compose_run


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
