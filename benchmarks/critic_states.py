"""A finished PPO run's critic at the turns it sampled: its values against the turns' returns to go, and how much a
turn's state moves the hidden state a critic of N layers reads.

    python benchmarks/critic_states.py RUN_DIR [RUN_DIR ...] [--policy POLICY_DIR] [--layers 1 3 6 10 15 20 25 30]

Each run's final critic (``RUN_DIR/checkpoints/last.ckpt``, built as the run's ``.hydra/config.yaml`` builds it) is
read at every turn of the run's sampled episodes (``samples.jsonl``) at the prompt's last token: ``V`` of the state
before the turn's first response token, against the turn's return to go (the discounted sum of the episode's turn
rewards from that turn on, at the run's gamma: the critic's target with lambda = 1, the recipe's).
``critic/explained_variance`` is 0 for a constant ``V`` at any level; the sd of ``V`` over the turns says whether the
critic tells states apart.

With ``--policy`` (a policy folder, e.g. a warm start's ``policy``), the same turns through that policy: at each depth
N, the normed hidden state after N decoder layers at the prompt's last token (what ``model.critic_layers=N`` reads), its
spread across the turns (the mean over dimensions of the sd across turns, over the root mean square), and
leave-one-episode-out ridge probes of the return to go from it, beside a probe from the turn index and the task.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from lightning_epo.algos.advantages import discounted_turn_returns
from lightning_epo.algos.losses import explained_variance
from lightning_epo.models.loading import load_critic, load_tokenizer
from lightning_epo.reports.run_history import load_run_config

PENALTIES = (10.0, 100.0, 1000.0, 10000.0)


def sampled_turns(run_dir: Path) -> list[dict]:
    """Every turn of the run's sampled episodes: its prompt, its episode, index and task, and its return to go
    (:func:`discounted_turn_returns` at the run's ``algo.gae.gamma``: with lambda = 1, the critic's target)."""
    gamma = load_run_config(run_dir)["algo"]["gae"]["gamma"]
    turns = []
    for episode_index, line in enumerate((run_dir / "samples.jsonl").read_text().splitlines()):
        episode = json.loads(line)
        turns += [{"prompt": turn["prompt"], "reward": turn["reward"], "turn": i, "episode": episode_index,
                   "task": episode["task"].split(".")[0]} for i, turn in enumerate(episode["turns"])]
    returns = discounted_turn_returns(*(torch.tensor([t[key] for t in turns]) for key in ("reward", "episode", "turn")),
                                      gamma=gamma)
    for turn, value in zip(turns, returns.tolist()):
        turn["return_to_go"], turn["episode"] = value, f"{run_dir}:{turn['episode']}"
    return turns


def final_critic(run_dir: Path) -> tuple[torch.nn.Module, dict]:
    """The run's critic with its weights from ``last.ckpt`` (every critic parameter is in it) and its model config."""
    model_cfg = load_run_config(run_dir)["model"]
    critic = load_critic(model_cfg)
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    critic.load_state_dict({name.removeprefix("critic."): value for name, value in state.items()
                            if name.startswith("critic.")})
    return critic.eval(), model_cfg


def critic_values(run_dir: Path) -> None:
    critic, model_cfg = final_critic(run_dir)
    tokenizer = load_tokenizer(model_cfg)
    turns = sampled_turns(run_dir)
    with torch.no_grad():
        values = torch.tensor([float(critic(ids, torch.ones_like(ids))[0, -1]) for ids in (
            tokenizer(t["prompt"] + tokenizer.eos_token, return_tensors="pt", add_special_tokens=False).input_ids
            for t in turns)])  # values[:, p] reads position p - 1: one token past the prompt reads its last token
    returns = torch.tensor([t["return_to_go"] for t in turns])
    ev = explained_variance(returns[None], values[None], torch.ones(1, len(turns), dtype=torch.bool))
    print(f"{run_dir}: {len(turns)} turns; return to go mean {returns.mean():.2f} sd {returns.std():.2f}; "
          f"V mean {values.mean():.2f} sd {values.std():.3f}; explained variance {ev:.3f}; "
          f"correlation {torch.corrcoef(torch.stack([values, returns]))[0, 1]:.3f}")


def leave_one_episode_out_r2(features: np.ndarray, returns: np.ndarray, episodes: np.ndarray, penalty: float) -> float:
    """R² of a ridge probe ``returns ~ features`` (standardised on the training fold) over held-out episodes.

    ``features [T, F]``, ``returns [T]``, ``episodes [T]`` (one label per turn); the prediction for each episode's
    turns comes from a fit on every other episode's."""
    predicted = np.zeros_like(returns)
    for episode in np.unique(episodes):
        train, test = episodes != episode, episodes == episode
        mean, sd = features[train].mean(0), features[train].std(0) + 1e-8
        x = (features[train] - mean) / sd
        centred = returns[train] - returns[train].mean()
        weights = np.linalg.solve(x.T @ x + penalty * np.eye(x.shape[1]), x.T @ centred)
        predicted[test] = (features[test] - mean) / sd @ weights + returns[train].mean()
    return float(1 - ((returns - predicted) ** 2).sum() / ((returns - returns.mean()) ** 2).sum())


def probe_depths(run_dirs: list[Path], policy: Path, layers: list[int]) -> None:
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32).eval()
    tokenizer = load_tokenizer({"name_or_path": str(policy)})
    turns = [t for run_dir in run_dirs for t in sampled_turns(run_dir)]
    states: dict[int, list[np.ndarray]] = {n: [] for n in layers}
    began, tokens = time.monotonic(), 0
    with torch.no_grad():
        for turn in turns:
            ids = tokenizer(turn["prompt"], return_tensors="pt", add_special_tokens=False).input_ids
            tokens += ids.shape[1]
            hidden = model.model(input_ids=ids, output_hidden_states=True).hidden_states  # the last one is normed
            for n in layers:
                last = hidden[n][0, -1]
                states[n].append((last if n == len(hidden) - 1 else model.model.norm(last)).double().numpy())
    print(f"{policy}: {len(turns)} turns, {tokens} prompt tokens, {time.monotonic() - began:.0f} s")
    returns = np.array([t["return_to_go"] for t in turns])
    episodes = np.array([t["episode"] for t in turns])
    tasks = sorted({t["task"] for t in turns})
    simple = np.array([[t["turn"]] + [t["task"] == task for task in tasks] for t in turns], dtype=float)
    print("turn index and task: " + ", ".join(
        f"penalty {p:g} R² {leave_one_episode_out_r2(simple, returns, episodes, p):+.3f}" for p in (0.1, 1.0, 10.0)))
    for n in layers:
        x = np.array(states[n])
        spread = float(x.std(0).mean() / np.sqrt((x**2).mean()))
        print(f"{n:2d} layers: spread across turns {spread:.3f}; " + ", ".join(
            f"penalty {p:g} R² {leave_one_episode_out_r2(x, returns, episodes, p):+.3f}" for p in PENALTIES))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--policy", type=Path, default=None)
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 3, 6, 10, 15, 20, 25, 30])
    args = parser.parse_args()
    torch.set_num_threads(2)
    for run_dir in args.runs:
        critic_values(run_dir)
    if args.policy is not None:
        probe_depths(args.runs, args.policy, args.layers)


if __name__ == "__main__":
    main()
