"""``logger=wandb``: Lightning's WandbLogger, with the command line's secrets kept out of the run's ``args``."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.loggers import WandbLogger

from lightning_epo.core.secrets import scrubbed_argv


class ScrubbedWandbLogger(WandbLogger):
    """Starts its wandb run with ``sys.argv`` scrubbed: ``wandb.init`` records the command line (a literal
    ``+model.token=...``) in the run's metadata. The hyperparameters arrive scrubbed from the module."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # Lightning passes wandb.init an ``anonymous`` setting (None unless asked), which wandb 0.31 no longer uses and
        # warns about whatever its value; left out, the run is the same.
        self._wandb_init.pop("anonymous", None)

    @property
    def experiment(self) -> Any:
        """The wandb run, started on first use (Lightning's property) while ``sys.argv`` is scrubbed."""
        with scrubbed_argv():
            return super().experiment
