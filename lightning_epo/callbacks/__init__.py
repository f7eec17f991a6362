"""Callbacks: the entropy history window, the beta_k schedule, RL-step checkpoints, weight sync, policy export,
the success report, every evaluation episode's outcome, the progress bar, the host memory's growth."""

from lightning_epo.callbacks.beta_schedule import BetaSchedule
from lightning_epo.callbacks.checkpoint import RLStepCheckpoint
from lightning_epo.callbacks.entropy_window import EntropyWindow
from lightning_epo.callbacks.eval_episodes import EvalEpisodesLog
from lightning_epo.callbacks.export_policy import ExportPolicy
from lightning_epo.callbacks.host_memory_watch import HostMemoryWatch
from lightning_epo.callbacks.progress_bar import RLProgressBar
from lightning_epo.callbacks.rollout_samples import RolloutSamples
from lightning_epo.callbacks.stop_at_step import StopAtStep
from lightning_epo.callbacks.success_report import SuccessReport
from lightning_epo.callbacks.turn_entropy import TurnEntropyLog
from lightning_epo.callbacks.wandb_setup import WandbSetup
from lightning_epo.callbacks.weight_sync import WeightSync

__all__ = [
    "BetaSchedule",
    "EntropyWindow",
    "EvalEpisodesLog",
    "ExportPolicy",
    "HostMemoryWatch",
    "RLProgressBar",
    "RLStepCheckpoint",
    "RolloutSamples",
    "StopAtStep",
    "SuccessReport",
    "TurnEntropyLog",
    "WandbSetup",
    "WeightSync",
]
