"""One GRPO loss + backward, ours next to TRL's, on the same model, token ids, old log-probs and advantages.

Ours: ``actor_token_outputs`` + ``epo_objective`` with ``conf/algo/grpo.yaml``'s clipping and no entropy
term. TRL: ``GRPOTrainer._compute_loss`` (TRL 1.16, its own venv ``benchmarks/.venv-trl`` so the project's
pins stay), called directly with hand-built inputs, in float32 (``bf16=False``: TRL's configs default to
bf16 autocast, which on this CPU alone moves the loss by about 1e-3 relative). Two aggregations that both sides have:

- TRL's default ``loss_type="dapo"`` (sum over all completion tokens / their number) = our ``loss_agg=token``;
- TRL's ``loss_type="grpo"`` (mean over each completion's tokens, then over completions) = our Eq. 4
  weights (``loss_agg=trajectory``) with each completion a one-turn trajectory.

The tiny model samples two GRPO groups of completions of two gridworld prompts (cut to one length: TRL
left-pads prompts and does not shift position ids, so only equal-length prompts give both sides the same
positions). Old log-probs are the current ones plus noise, so some ratios are clipped. Exchanged with the
TRL process through a temporary ``.pt`` file. Reported: the loss of both, the largest difference of the
per-token log-probs and of the parameter gradients, and the median CPU time (one thread) of forward + loss +
backward over repeats.

    python benchmarks/trl_grpo.py [--quick] [--trl-python benchmarks/.venv-trl/bin/python]

Setup of the TRL venv (once)::

    python3 -m venv benchmarks/.venv-trl
    benchmarks/.venv-trl/bin/pip install torch==2.13.0 transformers==5.23.0 trl==1.16.0

The top level imports only torch and the standard library: the TRL venv runs this file too (``--trl-worker``).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
TRL_PYTHON = REPO_ROOT / "benchmarks" / ".venv-trl" / "bin" / "python"
CLIP = 0.2  # conf/algo/grpo.yaml clip_low = clip_high; TRL's epsilon default
LOSS_TYPES = {"dapo": "token", "grpo": "trajectory"}  # TRL loss_type -> our algo.loss_agg


def cpu_times(step, repeats: int) -> list[float]:
    """CPU seconds of ``repeats`` calls of ``step`` after one warm-up call."""
    step()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        step()
        times.append(time.process_time() - start)
    return times


def flat_grad(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])


# ------------------------------------------------------------------------- TRL side (runs in the TRL venv)
def trl_worker(inputs_path: str, outputs_path: str) -> None:
    """Load the exchanged inputs, run TRL's GRPO loss for each loss type, save losses, log-probs, grads, times."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(1)
    data = torch.load(inputs_path)
    tokenizer = AutoTokenizer.from_pretrained(data["model_dir"])
    results = {}
    with tempfile.TemporaryDirectory() as out_dir:
        for loss_type in LOSS_TYPES:
            model = AutoModelForCausalLM.from_pretrained(data["model_dir"], dtype=torch.float32)
            batch = data["prompt_ids"].shape[0]
            args = GRPOConfig(
                output_dir=out_dir, use_cpu=True, bf16=False, report_to=[], loss_type=loss_type, epsilon=CLIP, beta=0.0,
                per_device_train_batch_size=batch, num_generations=data["group_size"], temperature=1.0,
                max_completion_length=data["completion_ids"].shape[1], logging_steps=1, save_strategy="no",
            )
            trainer = GRPOTrainer(
                model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                train_dataset=Dataset.from_dict({"prompt": ["x"] * batch}), processing_class=tokenizer,
            )
            trainer.current_gradient_accumulation_steps = 1  # set by Trainer's training loop otherwise
            model = trainer.model.train()
            inputs = {
                "prompt_ids": data["prompt_ids"], "prompt_mask": torch.ones_like(data["prompt_ids"]),
                "completion_ids": data["completion_ids"], "completion_mask": data["completion_mask"],
                "advantages": data["advantages"], "old_per_token_logps": data["old_logprobs"],
                "num_items_in_batch": data["completion_mask"].sum(),
            }

            def step() -> torch.Tensor:
                model.zero_grad(set_to_none=True)
                loss = trainer._compute_loss(model, inputs)
                loss.backward()
                return loss

            loss = step()
            with torch.no_grad():
                prompt_len = data["prompt_ids"].shape[1]
                full = torch.cat([data["prompt_ids"], data["completion_ids"]], 1)
                mask = torch.cat([inputs["prompt_mask"], data["completion_mask"]], 1)
                labels = full.masked_fill(mask == 0, -100)
                labels[:, :prompt_len] = -100
                logps = model(input_ids=full, attention_mask=mask, labels=labels, fused_lm_head=True).log_probs
            results[loss_type] = {
                "loss": float(loss.detach()), "logprobs": logps[:, prompt_len - 1 :], "grad": flat_grad(model),
                "times": cpu_times(step, data["repeats"]),
            }
    torch.save(results, outputs_path)


# ------------------------------------------------------------------------- our side (the project's venv)
def build_inputs(repeats: int, groups: int, group_size: int, max_new_tokens: int, seed: int = 0) -> dict:
    """Prompts, sampled completions, GRPO advantages and perturbed old log-probs from the tiny model."""
    from omegaconf import OmegaConf

    from lightning_epo.envs.gridworld import GridworldSuite
    from lightning_epo.models.loading import load_actor, load_tokenizer, model_source
    from lightning_epo.rollout.engine import SamplingParams
    from lightning_epo.rollout.hf_engine import HFEngine
    from lightning_epo.rollout.prompts import PromptBuilder

    model_cfg = OmegaConf.load(REPO_ROOT / "conf" / "model" / "tiny.yaml")
    tokenizer, actor = load_tokenizer(model_cfg), load_actor(model_cfg)
    suite, builder = GridworldSuite(), PromptBuilder("gridworld", history_length=2, think=False)
    env = suite.make_env()
    prompts = []
    for task in suite.tasks("train")[:groups]:
        observation, info = env.reset(task)
        prompts.append(builder.token_ids(tokenizer, builder.text(info["task"], observation, info["admissible_actions"], [], 0)))
    length = min(len(p) for p in prompts)
    prompts = [p[len(p) - length :] for p in prompts for _ in range(group_size)]  # same length, see the docstring
    torch.manual_seed(seed)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens)
    generations = HFEngine(tokenizer, actor).generate(prompts, sampling)
    # the random model rarely stops by itself: cut completions to random lengths so that the two aggregations differ
    lengths = [int(torch.randint(max(1, len(g.token_ids) // 4), len(g.token_ids) + 1, ())) for g in generations]
    completion_ids = torch.full((len(prompts), max(lengths)), tokenizer.pad_token_id, dtype=torch.long)
    completion_mask = torch.zeros((len(prompts), max(lengths)), dtype=torch.long)
    for row, (g, n) in enumerate(zip(generations, lengths)):
        completion_ids[row, :n] = torch.tensor(g.token_ids[:n])
        completion_mask[row, :n] = 1
    rewards = torch.rand(groups, group_size)
    advantages = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)).reshape(-1)
    data = {
        "model_dir": model_source(model_cfg)[0], "prompt_ids": torch.tensor(prompts), "completion_ids": completion_ids,
        "completion_mask": completion_mask, "advantages": advantages, "group_size": group_size, "repeats": repeats,
    }
    current, _ = our_logprobs_and_loss(data, "token", old_logprobs=None)
    data["old_logprobs"] = (current + 0.2 * torch.randn(current.shape)) * completion_mask
    return data


def our_logprobs_and_loss(data: dict, loss_agg: str, old_logprobs: torch.Tensor | None, repeats: int = 0):
    """Our completion log-probs ``[B, C]`` (no grad) when ``old_logprobs`` is None; else the loss, grad and times."""
    from omegaconf import OmegaConf

    from lightning_epo.algos import token_mean_weights, trajectory_weights
    from lightning_epo.algos.objective import ObjectiveSettings, StepTargets, epo_objective
    from lightning_epo.models.loading import load_actor
    from lightning_epo.models.policy_outputs import actor_token_outputs

    actor = load_actor(OmegaConf.load(REPO_ROOT / "conf" / "model" / "tiny.yaml")).train()
    prompt_len = data["prompt_ids"].shape[1]
    input_ids = torch.cat([data["prompt_ids"], data["completion_ids"]], 1)
    attention_mask = torch.cat([torch.ones_like(data["prompt_ids"]), data["completion_mask"]], 1)
    response_mask = torch.zeros_like(attention_mask, dtype=torch.bool)
    response_mask[:, prompt_len:] = data["completion_mask"].bool()
    if old_logprobs is None:
        with torch.no_grad():
            logprob, _ = actor_token_outputs(actor, input_ids, attention_mask, response_mask)
        return logprob[:, prompt_len:], None
    pad = torch.zeros(input_ids.shape[0], prompt_len)
    weights = (token_mean_weights(response_mask) if loss_agg == "token"
               else trajectory_weights(response_mask, torch.arange(input_ids.shape[0])))
    targets = StepTargets(
        old_logprobs=torch.cat([pad, old_logprobs], 1), advantages=data["advantages"][:, None] * response_mask,
        pg_weights=weights, traj_weights=weights, mean_weights=weights,
    )
    settings = ObjectiveSettings(
        entropy_coef=0.0, beta=0.0, entropy_ref=None, smoothing=False, clip_low=CLIP, clip_high=CLIP
    )

    def step() -> torch.Tensor:
        actor.zero_grad(set_to_none=True)
        logprob, entropy = actor_token_outputs(actor, input_ids, attention_mask, response_mask)
        loss, _ = epo_objective(logprob, entropy, None, targets, settings)
        loss.backward()
        return loss

    loss = step()
    with torch.no_grad():
        logprob, _ = actor_token_outputs(actor, input_ids, attention_mask, response_mask)
    result = {"loss": float(loss.detach()), "grad": flat_grad(actor), "times": cpu_times(step, repeats)}
    return logprob[:, prompt_len:], result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one small batch, few repeats (about a minute)")
    parser.add_argument("--trl-python", default=str(TRL_PYTHON), help="python of the venv with trl installed")
    parser.add_argument("--trl-worker", nargs=2, metavar=("INPUTS", "OUTPUTS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trl_worker:
        trl_worker(*args.trl_worker)
        return
    if not Path(args.trl_python).exists():
        sys.exit(f"error: no TRL venv at {args.trl_python}; create it as this file's docstring shows "
                 "or pass --trl-python")
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    from bench_utils import machine_line, print_table

    torch.set_num_threads(1)
    repeats, groups, group_size, new_tokens = (3, 2, 4, 24) if args.quick else (10, 2, 8, 48)
    data = build_inputs(repeats, groups, group_size, new_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        inputs_path, outputs_path = Path(tmp) / "inputs.pt", Path(tmp) / "outputs.pt"
        torch.save(data, inputs_path)
        trl_version = subprocess.run([args.trl_python, "-c", "import trl; print(trl.__version__)"],
                                     capture_output=True, text=True, check=True).stdout.strip()
        run = subprocess.run([args.trl_python, __file__, "--trl-worker", str(inputs_path), str(outputs_path)],
                             capture_output=True, text=True, check=False)
        if run.returncode != 0:
            sys.exit(f"error: the TRL worker failed:\n{run.stderr[-3000:]}")
        trl = torch.load(outputs_path)
    print(machine_line())
    mask = data["completion_mask"].bool()
    print(f"\nGRPO loss + backward, tiny model, {len(data['advantages'])} completions "
          f"({groups} groups of {group_size}), "
          f"prompt {data['prompt_ids'].shape[1]} tokens, {int(mask.sum())} completion tokens; TRL {trl_version}; "
          f"CPU time, 1 thread, median of {repeats}")
    rows = []
    for loss_type, loss_agg in LOSS_TYPES.items():
        our_lp, ours = our_logprobs_and_loss(data, loss_agg, data["old_logprobs"], repeats)
        theirs = trl[loss_type]
        lp_diff = float((our_lp - theirs["logprobs"])[mask].abs().max())
        grad_diff = float((ours["grad"] - theirs["grad"]).abs().max() / theirs["grad"].abs().max())
        ours_s, trl_s = statistics.median(ours["times"]), statistics.median(theirs["times"])
        rows.append([f"{loss_type} / loss_agg={loss_agg}", f"{ours['loss']:.8f}", f"{theirs['loss']:.8f}",
                     f"{abs(ours['loss'] - theirs['loss']):.1e}", f"{lp_diff:.1e}", f"{grad_diff:.1e}",
                     ours_s, trl_s, f"{trl_s / ours_s:.2f}"])
    print_table(["TRL loss_type / ours", "our loss", "TRL loss", "|diff|", "max |dlogp|", "max |dgrad| / max |grad|",
                 "ours s", "TRL s", "TRL / ours"], rows)


if __name__ == "__main__":
    main()
