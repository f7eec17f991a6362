"""Unpack the ALFWorld game files into data/alfworld/ (``make setup`` runs it when ../shared/alfworld has them).

    python scripts/unpack_alfworld.py [--archive A] [--dest D]

The unpacking itself is :func:`lightning_epo.envs.alfworld_data.unpack_alfworld` (idempotent, atomic).
"""

from __future__ import annotations

import argparse
import tarfile
from pathlib import Path

from lightning_epo.envs.alfworld_data import DEFAULT_ARCHIVE, DEFAULT_DATA_DIR, GAMES_ROOT, unpack_alfworld


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Unpack the ALFWorld game files into data/alfworld/.")
    parser.add_argument("--archive", type=Path, default=DEFAULT_ARCHIVE, help="json_2.1.1 tarball")
    parser.add_argument("--dest", type=Path, default=DEFAULT_DATA_DIR, help="target folder (env.suite.data_dir)")
    args = parser.parse_args(argv)
    try:
        dest = unpack_alfworld(args.archive, args.dest)
    except (OSError, ValueError, tarfile.TarError) as err:
        parser.exit(1, f"error: {err}\n")
    print(f"ALFWorld games ready in {dest / GAMES_ROOT}")


if __name__ == "__main__":
    main()
