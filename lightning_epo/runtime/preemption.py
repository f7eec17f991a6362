"""Preemption: SIGTERM (what SLURM and Kubernetes send) or Ctrl+C ends a run after its current RL step, or within
seconds during an evaluation.

The first signal sets Lightning's own flag (``trainer.received_sigterm``): the training loop stops right after
the step's batch-end hooks, where :class:`~lightning_epo.callbacks.RLStepCheckpoint` writes ``last.ckpt`` of that
step (entropy window, beta_k and sampler state included), and the DataModule closes its environments. An evaluation
(before the first step, after a step, the final one, ``mode=eval``) stops between two turns instead
(``RolloutDataModule.eval_batch``: minutes to an hour of episodes would outlast a job's grace period), its episodes
discarded: no ``eval.json``, no logged value; the step before it has its checkpoint, and the resumed run plays the
evaluation from its start (lightning_epo/runtime/run.py). The process
then exits with status 128 + the signal's number (143 for SIGTERM, 130 for SIGINT), so that a job script can tell a
preempted run (resume it with ``ckpt_path=last``) from a finished one (0). A second Ctrl+C aborts at once.

Lightning's SLURM support is untouched: with ``SLURMEnvironment(auto_requeue=True)`` its requeue signal (SIGUSR1)
still saves ``hpc_ckpt_*.ckpt`` and requeues the job, and its SIGTERM handler calls this one too.
Outside a trainer call (building the model, between validation and fit) there is no step to finish: a signal
stops the process at once, with the same status.
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from types import FrameType, TracebackType

from lightning_epo.core import layout
from lightning_epo.training.checkpoint_io import newest_checkpoint

log = logging.getLogger(__name__)
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preemption:
    """Context manager around a whole run (``train.py``): turns SIGTERM / SIGINT into a checkpointed stop and
    the exit status 128 + the signal's number (see the module docstring). ``signum``: the first signal received."""

    def __init__(self, run_dir: str | Path | None = None) -> None:
        """``run_dir``: the run's directory, so that a stop advises a resume only where a checkpoint exists (the
        run's, or its warm start's: RUN_DIR/warm_start/checkpoints)."""
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> Preemption:
        """Install the handlers (Lightning's SIGTERM handler, while a trainer runs, calls them after its own)."""
        self._previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
        for signum in SIGNALS:
            signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        """Restore the handlers; a run stopped by a signal exits with status 128 + its number."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        if exc is not None and self.signum is not None:
            name = signal.Signals(self.signum).name
            log.warning("stopped by %s (exit status %d): %s", name, 128 + self.signum, self._advice())
            raise SystemExit(128 + self.signum) from exc

    def _advice(self) -> str:
        """What resumes the stopped run: its ``last.ckpt``, else its warm start's checkpoint, else nothing."""
        if self.run_dir is None:
            return "no checkpoint was written (the run has no directory): start the run again"
        if newest_checkpoint(self.run_dir / layout.CHECKPOINTS) is not None:
            return "resume with ckpt_path=last"
        stage = newest_checkpoint(self.run_dir / layout.WARM_START / layout.CHECKPOINTS)
        if stage is not None:
            return (f"the warm start resumes from {stage} when the same command runs again (the same "
                    "hydra.run.dir, no ckpt_path: the RL stage has no checkpoint yet)")
        return "no checkpoint was written yet (stopped before the first step ended): start the run again"

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """First signal: ask the running trainer to stop after its current step, or stop now when none runs.
        A repeated Ctrl+C aborts (KeyboardInterrupt: Lightning tears down, the exit status stays 130)."""
        first = self.signum is None
        self.signum = self.signum or signum
        lightning = signal.getsignal(signal.SIGTERM)
        if lightning == self._on_signal:  # no trainer is running: nothing to finish
            raise SystemExit(128 + self.signum)
        if signum == signal.SIGINT:
            if not first:
                raise KeyboardInterrupt
            # Lightning only listens to SIGTERM. Its handler calls this one again, which then only records.
            lightning(signal.SIGTERM, frame)
