"""User-facing errors: bad input that the user fixes (a config value, a path, missing data or Java).

Command-line entry points print these as one line (``error: ...``) and exit with status 2
(:func:`exit_with_error`); for ``train.py`` set ``LIGHTNING_EPO_TRACEBACK=1`` to see the stack trace instead.
"""

from __future__ import annotations

import sys
from typing import NoReturn


class UserError(ValueError):
    """Bad input, with a message that names the fix."""


class ConfigError(UserError):
    """An invalid configuration value."""


class TrainingDiverged(UserError):
    """The run's loss, gradients, parameters or policy outputs stopped being finite (or exploded): the run
    stops before the bad step is checkpointed, naming the checkpoint to resume from (at a lower lr)."""


def exit_with_error(message: object) -> NoReturn:
    """Print ``error: <message>`` to stderr and exit with status 2 (bad input; the message names the fix)."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)
