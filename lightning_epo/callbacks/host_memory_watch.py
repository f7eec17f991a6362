"""Says, once, when the trainer's host memory grows fast enough to outrun the machine before the run's last step."""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
import psutil

from lightning_epo.training.host_memory import growth_warning
from lightning_epo.training.step_clock import host_peak_rss_gib

log = logging.getLogger(__name__)
GIB = 2**30


class HostMemoryWatch(L.Callback):
    """After each RL step, this process's peak resident size (the step line's "host memory at most"); once the
    growth over the process's steps would pass its share of the machine's memory before step ``total_steps``
    (training/host_memory.py, :func:`growth_warning`), one warning with the fix, then nothing more. Under glibc a
    CPU run of the ScienceWorld recipe rose about 1 GiB a step and was killed for memory in its 15th
    (docs/real_model.md, "ScienceWorld"). The machine's memory is shared by the node's processes (``num_devices``)."""

    def __init__(self, total_steps: int) -> None:
        self.total_steps = total_steps
        self.peaks: list[float] = []
        self.warned = False

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.warned or not trainer.is_global_zero:
            return
        self.peaks.append(host_peak_rss_gib())
        capacity = psutil.virtual_memory().total / GIB / max(trainer.num_devices, 1)
        warning = growth_warning(self.peaks, pl_module.rl_step, self.total_steps, capacity)
        if warning is not None:
            log.warning(warning)
            self.warned = True
