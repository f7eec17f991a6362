"""A few whole training episodes per RL step, as text: what the agent saw, said, did and got."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from lightning_epo.callbacks.report_io import append_jsonl, wandb_logger
from lightning_epo.core import layout
from lightning_epo.rollout.episode import Episode

COLUMNS = ["step", "traj_id", "turn", "task", "prompt", "response", "action", "observation", "reward", "won"]


def episode_record(ep: Episode, step: int, decode: Any = None) -> dict[str, Any]:
    """One episode as a JSON object; ``decode`` (token ids -> text) adds each turn's prompt text."""
    return {
        "step": step,
        "traj_id": ep.traj_id,
        "task": ep.task,
        "won": bool(ep.won),
        "return": float(ep.episode_return),
        "truncated": bool(ep.truncated),
        "turns": [
            {
                "turn": t.turn_idx,
                **({"prompt": decode(t.prompt_ids)} if decode is not None else {}),
                "response": t.response_text,
                "action": t.action,
                "action_valid": t.action_valid,
                "observation": t.observation,
                "reward": float(t.reward),
            }
            for t in ep.turns
        ],
    }


class RolloutSamples(L.Callback):
    """After RL step k, appends the first ``num_episodes`` episodes of the step's rollout (rank 0's) to
    ``RUN_DIR/samples.jsonl`` (one episode per line, see :func:`episode_record`) and, with a
    WandbLogger, logs them as the table ``tables/rollout_samples`` (one row per turn).

    The prompt text is decoded from the prompt token ids with the DataModule's tokenizer (special tokens
    kept, exactly what the model saw); ``include_prompt=False`` leaves it out (prompts are long)."""

    def __init__(self, run_dir: str, num_episodes: int = 2, include_prompt: bool = True,
                 wandb_key: str = "tables/rollout_samples") -> None:
        if num_episodes < 1:
            raise ValueError(f"num_episodes must be >= 1, got {num_episodes}")
        self.path = Path(run_dir) / layout.SAMPLES
        self.num_episodes, self.include_prompt, self.wandb_key = num_episodes, include_prompt, wandb_key

    def _decoder(self, trainer: L.Trainer) -> Any:
        tokenizer = getattr(trainer.datamodule, "tokenizer", None) if self.include_prompt else None
        return None if tokenizer is None else (lambda ids: tokenizer.decode(ids, skip_special_tokens=False))

    @rank_zero_only
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step, rollout = pl_module.step_report.rl_step, pl_module.step_report.rollout
        if rollout is None:
            return
        decode = self._decoder(trainer)
        records = [episode_record(ep, step, decode) for ep in rollout.episodes[: self.num_episodes]]
        append_jsonl(self.path, records)
        logger = wandb_logger(trainer)
        if logger is not None:
            rows = [
                [step, r["traj_id"], t["turn"], r["task"], t.get("prompt", ""), t["response"], t["action"] or "",
                 t["observation"], t["reward"], r["won"]]
                for r in records
                for t in r["turns"]
            ]
            logger.log_table(self.wandb_key, columns=COLUMNS, data=rows, step=step)
