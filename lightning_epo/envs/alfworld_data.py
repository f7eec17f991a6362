"""Where the ALFWorld games live, and unpacking the shared archive into ``data/alfworld/``.

The games are ALFWorld's TextWorld files, laid out as ``alfworld-download`` leaves them under
``$ALFWORLD_DATA``::

    <data_dir>/json_2.1.1/{train,valid_seen,valid_unseen}/<task-folder>/<trial>/game.tw-pddl

``data_dir`` is resolved as: the explicit config value (``env.suite.data_dir``), else ``$ALFWORLD_DATA``,
else ``data/alfworld`` in the repository (what ``scripts/unpack_alfworld.py``, run by ``make setup``, unpacks
from ``../shared/alfworld/alfworld_json_2.1.1.tar.xz``). Unpacking is idempotent: an existing
``json_2.1.1/`` (unpacked here or by ``alfworld-download``) is left alone.
"""

from __future__ import annotations

import os
import tarfile
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DATA_DIR = REPO_ROOT / "data" / "alfworld"
DEFAULT_ARCHIVE = REPO_ROOT.parent / "shared" / "alfworld" / "alfworld_json_2.1.1.tar.xz"
GAMES_ROOT = "json_2.1.1"
GAME_FILE = "game.tw-pddl"

FIX_HINT = (
    "run `python scripts/unpack_alfworld.py` (unpacks ../shared/alfworld into data/alfworld), "
    "or set env.suite.data_dir / $ALFWORLD_DATA to a folder holding json_2.1.1/ (e.g. made by `alfworld-download`)"
)


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The ALFWorld data folder: ``data_dir`` if given, else ``$ALFWORLD_DATA``, else ``data/alfworld``."""
    if data_dir:
        return Path(data_dir).expanduser().resolve()
    from_env = os.environ.get("ALFWORLD_DATA")
    return Path(from_env).expanduser().resolve() if from_env else DEFAULT_DATA_DIR


def unpack_alfworld(archive: str | os.PathLike = DEFAULT_ARCHIVE, dest: str | os.PathLike = DEFAULT_DATA_DIR) -> Path:
    """Unpack ``archive`` (a ``json_2.1.1`` tarball) into ``dest``; skip if ``dest/json_2.1.1`` exists.

    The archive is unpacked into a temporary folder inside ``dest`` and moved in place only when
    complete, so an interrupted run never leaves a half-filled ``json_2.1.1/`` that looks valid.
    Returns ``dest``.
    """
    archive, dest = Path(archive), Path(dest)
    if (dest / GAMES_ROOT).is_dir():
        return dest
    if not archive.is_file():
        raise FileNotFoundError(f"ALFWorld archive {archive} not found: pass --archive, or {FIX_HINT}")
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest, prefix=".unpacking-") as tmp:
        with tarfile.open(archive, "r:*") as tar:
            tar.extractall(tmp, filter="data")
        if not (Path(tmp) / GAMES_ROOT).is_dir():
            raise ValueError(f"ALFWorld archive {archive} holds no {GAMES_ROOT}/ folder; is it the right file?")
        os.replace(Path(tmp) / GAMES_ROOT, dest / GAMES_ROOT)
    return dest
