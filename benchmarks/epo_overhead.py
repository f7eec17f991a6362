"""Cost of EPO's entropy terms: PPO+EPO update time divided by plain PPO's, on the same episodes.

Both arms run the project's own update path in one process: ``actor_token_outputs`` (output layer on
response positions only; token entropy always computed, as verl computes it for its metrics) ->
``epo_objective`` with per-step ``StepTargets`` -> backward per micro-batch -> gradient clipping and one
AdamW step. Plain PPO has ``entropy_coef=0`` (no backward through the entropy); PPO+EPO has
``lambda=0.001`` and the smoothing penalty (Eq. 5-6) with a window mean ``Hbar``. Only the actor is
timed (a critic would add the same time to both arms and pull the ratio towards 1).

Models: (a) the project's tiny model (``model=tiny``) and (b) a Qwen2.5-shaped model with random weights
(vocabulary 151936, so the output layer has its real size, but only a few layers).
PPO and EPO updates alternate (PPO, EPO, EPO, PPO, ...) to cancel load drift; each figure is a median
over the repeats and the ratio is ``median(EPO) / median(PPO)``. The clock is the process's CPU time with
one torch thread by default: on a shared machine wall time also counts the time other jobs hold the
cores (it varied 3x between identical updates here), CPU time does not.

    python benchmarks/epo_overhead.py [--quick] [--profile]

The last line printed is ``overhead_ratio X`` for the Qwen-shaped model.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import bench_utils  # noqa: F401 - puts the repository on sys.path
import torch
from bench_utils import REPO_ROOT, machine_line, median, print_table, spread
from omegaconf import OmegaConf
from transformers import Qwen2Config, Qwen2ForCausalLM

from lightning_epo.algos import trajectory_weights
from lightning_epo.algos.objective import ObjectiveSettings, StepTargets, epo_objective
from lightning_epo.models.loading import load_actor
from lightning_epo.models.policy_outputs import actor_token_outputs
from lightning_epo.rollout.batch import RolloutBatch

QWEN_VOCAB = 151936  # Qwen2.5's vocabulary (output layer rows)


@dataclass(frozen=True)
class Workload:
    """One RL step's rows: ``rows`` turns of prompts up to ``prompt_len`` and responses up to ``response_len``."""

    rows: int
    prompt_len: int
    response_len: int
    micro_batch: int
    turns_per_traj: int = 4


def tiny_model() -> torch.nn.Module:
    """The project's ``model=tiny`` actor, loaded (or built on first use) as training does."""
    return load_actor(OmegaConf.load(REPO_ROOT / "conf" / "model" / "tiny.yaml")).train()


def qwen_shaped_model(hidden: int, layers: int, seed: int = 0) -> torch.nn.Module:
    """A random Qwen2 model with Qwen2.5's vocabulary and tied embeddings (like 0.5B/3B), ``layers`` deep."""
    config = Qwen2Config(
        vocab_size=QWEN_VOCAB,
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        dtype="float32",
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).train()


def synthetic_batch(w: Workload, vocab: int, seed: int = 0) -> RolloutBatch:
    """Right-padded rows of random token ids; prompt and response lengths vary (75-100% / 50-100% of the caps)."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(int(0.75 * w.prompt_len), w.prompt_len + 1, (w.rows,), generator=g)
    responses = torch.randint(max(1, w.response_len // 2), w.response_len + 1, (w.rows,), generator=g)
    length = int((prompts + responses).max())
    input_ids = torch.randint(3, vocab, (w.rows, length), generator=g)
    cols = torch.arange(length)
    attention_mask = (cols < (prompts + responses)[:, None]).long()
    response_mask = (cols >= prompts[:, None]) & attention_mask.bool()
    traj_ids = torch.arange(w.rows) // w.turns_per_traj
    return RolloutBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_mask=response_mask,
        traj_ids=traj_ids,
        turn_idx=torch.arange(w.rows) % w.turns_per_traj,
        group_ids=traj_ids,
        turn_rewards=torch.zeros(w.rows),
        episode_returns=torch.zeros(w.rows),
        state_ids=torch.arange(w.rows),
    )


def step_targets(model: torch.nn.Module, batch: RolloutBatch, micro_batch: int) -> tuple[StepTargets, float]:
    """Old log-probs from a no-grad pass (ratio starts at 1), random advantages, Eq. 4 weights; and ``Hbar``."""
    old_lp, old_h = torch.zeros(batch.input_ids.shape), torch.zeros(batch.input_ids.shape)
    with torch.no_grad():
        for rows in torch.arange(len(batch)).split(micro_batch):
            mb = batch.select(rows)
            lp, h = actor_token_outputs(model, mb.input_ids, mb.attention_mask, mb.response_mask)
            old_lp[rows, : lp.shape[1]], old_h[rows, : h.shape[1]] = lp, h
    mask = batch.response_mask
    advantages = torch.randn(mask.shape, generator=torch.Generator().manual_seed(1)) * mask
    weights = trajectory_weights(mask, batch.traj_ids)
    targets = StepTargets(
        old_logprobs=old_lp, advantages=advantages, pg_weights=weights, traj_weights=weights, mean_weights=weights
    )
    return targets, float(old_h[mask].mean())


def arm_settings(entropy_ref: float) -> dict[str, ObjectiveSettings]:
    """Plain PPO (entropy as a metric only) and PPO+EPO with the paper's hyperparameters."""
    return {
        "ppo": ObjectiveSettings(entropy_coef=0.0, beta=0.0, entropy_ref=None, smoothing=False),
        "ppo_epo": ObjectiveSettings(
            entropy_coef=0.001, beta=1.5, entropy_ref=entropy_ref, smoothing=True, kappa_l=0.0, kappa_r=2.0, alpha=0.05
        ),
    }


def update(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    batch: RolloutBatch,
    targets: StepTargets,
    settings: ObjectiveSettings,
    micro_batch: int,
) -> float:
    """One optimizer step over the batch's micro-batches, as ``EPOModule._ppo_update`` does; returns CPU seconds."""
    start = time.process_time()
    opt.zero_grad()
    for rows in torch.arange(len(batch)).split(micro_batch):
        mb = batch.select(rows)
        logprob, entropy = actor_token_outputs(model, mb.input_ids, mb.attention_mask, mb.response_mask)
        mb_targets = targets.select(rows, mb.input_ids.shape[1])
        loss, terms = epo_objective(logprob, entropy, None, mb_targets, settings)
        loss.backward()
        [float(value) for value in terms.values()]  # EPOModule reads every term as a float (a sync point on GPU)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad()
    return time.process_time() - start


def measure(name: str, model: torch.nn.Module, w: Workload, repeats: int, profile: bool) -> tuple[list[object], float]:
    """Interleaved PPO / EPO updates (one warm-up pair first); a table row and the ratio of medians."""
    vocab = model.get_output_embeddings().weight.shape[0]
    batch = synthetic_batch(w, vocab)
    targets, h_bar = step_targets(model, batch, w.micro_batch)
    settings = arm_settings(h_bar)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    times: dict[str, list[float]] = {"ppo": [], "ppo_epo": []}
    for i in range(repeats + 1):
        for arm in (("ppo", "ppo_epo") if i % 2 == 0 else ("ppo_epo", "ppo")):  # alternate which arm goes first
            seconds = update(model, opt, batch, targets, settings[arm], w.micro_batch)
            if i > 0:
                times[arm].append(seconds)
    if profile:
        profile_arms(model, opt, batch, targets, settings, w.micro_batch)
    ppo, epo = median(times["ppo"]), median(times["ppo_epo"])
    ratio = epo / ppo
    paired = median([e / p for p, e in zip(times["ppo"], times["ppo_epo"])])
    params = sum(p.numel() for p in model.parameters()) / 1e6
    tokens = int(batch.response_mask.sum())
    row = [name, f"{params:.1f}M", vocab, f"{w.rows}x<={w.prompt_len}+{w.response_len}", tokens, w.micro_batch,
           repeats, ppo, spread(times["ppo"]), epo, spread(times["ppo_epo"]), f"{ratio:.3f}", f"{paired:.3f}"]
    return row, ratio


def profile_arms(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    batch: RolloutBatch,
    targets: StepTargets,
    settings: dict[str, ObjectiveSettings],
    micro_batch: int,
) -> None:
    """Top operators by self CPU time of one update per arm (where EPO's extra time goes)."""
    from torch.profiler import ProfilerActivity, profile

    for arm, s in settings.items():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            update(model, opt, batch, targets, s, micro_batch)
        print(f"\n--- profile: {arm} (top 15 by self CPU time) ---")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small workload and few repeats (about a minute)")
    parser.add_argument("--repeats", type=int, help="PPO/EPO pairs per model (default 4 quick, 9 full)")
    parser.add_argument("--hidden", type=int, default=512, help="hidden size of the Qwen-shaped model")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers of the Qwen-shaped model")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (CPU time is measured)")
    parser.add_argument("--profile", action="store_true", help="also print a torch.profiler table per arm")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    repeats = args.repeats or (4 if args.quick else 9)
    tiny_w = Workload(rows=16, prompt_len=192, response_len=32, micro_batch=8)
    qwen_w = Workload(rows=4, prompt_len=96, response_len=32, micro_batch=4) if args.quick else \
        Workload(rows=8, prompt_len=192, response_len=48, micro_batch=4)
    print(machine_line())
    rows = []
    row, _ = measure("tiny", tiny_model(), tiny_w, repeats, args.profile)
    rows.append(row)
    qwen = qwen_shaped_model(args.hidden, args.layers)
    row, ratio = measure(f"qwen2.5-shaped d={args.hidden} L={args.layers}", qwen, qwen_w, repeats, args.profile)
    rows.append(row)
    print_table(
        ["model", "params", "vocab", "rows x (prompt+response)", "resp. tokens", "micro", "repeats",
         "PPO CPU s (median)", "PPO range", "EPO CPU s (median)", "EPO range", "EPO/PPO", "median paired ratio"],
        rows,
    )
    print(f"overhead_ratio {ratio:.3f}")


if __name__ == "__main__":
    main()
