"""User-facing errors: bad input that the user fixes (a config value, a path, missing data or Java).

``train.py`` prints these as one line (``error: ...``) and exits with status 2; set
``LIGHTNING_EPO_TRACEBACK=1`` to see the stack trace instead.
"""


class UserError(ValueError):
    """Bad input, with a message that names the fix."""


class ConfigError(UserError):
    """An invalid configuration value."""


class TrainingDiverged(UserError):
    """The run's loss, gradients, parameters or policy outputs stopped being finite (or exploded): the run
    stops before the bad step is checkpointed, naming the checkpoint to resume from (at a lower lr)."""
