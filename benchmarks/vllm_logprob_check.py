"""After a weight push, vLLM's log-probs of its own samples match the trainer's (on a CUDA GPU or the CPU).

    python benchmarks/vllm_logprob_check.py                       # the tiny model (model=tiny), float32
    python benchmarks/vllm_logprob_check.py --model-path Qwen/Qwen2.5-3B-Instruct --dtype bfloat16
    python benchmarks/vllm_logprob_check.py --model-path M --trainer-precision bf16-mixed
        # vLLM in bfloat16, the trainer's float32 weights under bf16 autocast: what
        # trainer.precision=bf16-mixed rollout.engine.dtype=bfloat16 runs
    python benchmarks/vllm_logprob_check.py --model-path M --engine-dtype bfloat16
        # vLLM in bfloat16 against the trainer in float32: what rollout.engine.dtype=bfloat16 alone runs
    python benchmarks/vllm_logprob_check.py --model-path M --shared-instruction
        # every prompt opens with one instruction (SHARED_INSTRUCTION), as an environment's
        # prompts do: vLLM's prefix cache serves its KV blocks to every prompt after the first

Run with the vLLM environment's Python (``.venv-vllm/bin/python``, ``make setup-vllm``). The trainer runs on
the GPU when there is one, else on the CPU, where vLLM runs too.

Steps: load the actor with transformers, move its weights away from the checkpoint (as an update would),
start the colocated VLLMEngine, push (``sync_weights``), sleep (GPU), push again (the path every RL step
takes), sample responses at temperature 1, then recompute every sampled token's log-prob with the trainer's
own code (``actor_token_outputs``). Passes when

- ``|logprob_vllm - logprob_trainer|`` has mean <= ``mean_tol`` and 99th percentile <= ``p99_tol``
  (float32: 1e-3 / 1e-2; bfloat16, where the two stacks run different kernels: 2e-2 / 0.2);
- on CPU in float32 (both stacks round in fp32, each its own way): its maximum is
  <= 1e-5, or vLLM's log-probs are as exact as the trainer's: their largest distance from the float64
  log-probs of the same tokens (the model's own forward in float64) is at most twice the trainer's. The
  absolute bound holds on the tiny model (two layers); rounding grows with depth and vocabulary, and on
  SmolLM2 (30 layers) the trainer's own float32 is 1.9e-5 from exact at most (benchmarks/RESULTS.md, section 11);
- the push took effect: the samples' log-probs under the *checkpoint's* weights differ at least twice
  as much as under the pushed weights.

Prints the machine, one JSON object, and last ``max_abs_diff X``; exits 1 when the check fails.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a plain script
    sys.path.insert(0, str(REPO_ROOT))

from lightning_epo.models.loading import load_actor, load_tokenizer  # noqa: E402
from lightning_epo.models.policy_outputs import actor_token_outputs  # noqa: E402
from lightning_epo.rollout.engine import Generation, SamplingParams  # noqa: E402
from lightning_epo.rollout.vllm_engine import VLLMEngine  # noqa: E402

TOLERANCES = {"float32": (1e-3, 1e-2), "bfloat16": (2e-2, 0.2), "float16": (2e-2, 0.2)}
CPU_FLOAT32_MAX_TOL = 1e-5
FLOAT32_ERROR_RATIO = 2.0  # vLLM's largest float32 error against float64, at most this times the trainer's
SHARED_INSTRUCTION = (  # one opening for every prompt, as an environment's prompts share theirs
    "You are an expert agent operating in the GridWorld environment, a text-based grid in which you walk to the goal "
    "object one step at a time and then use it. Read the task and the observation, then answer with one admissible "
    "action inside <action> </action> tags.\n"
)
PROMPTS = [
    "You are in a kitchen. Your task is to: put a clean apple in the fridge. What do you do first?",
    "You are in a 6x6 grid. The key is two cells to the north. Reply with <action>...</action>.",
    "Describe, step by step, how to boil water on a stove.",
    "Your admissible actions are: look, go to fridge 1, take apple 1. Choose one.",
]


@torch.no_grad()
def trainer_logprobs(actor: torch.nn.Module, prompt: list[int], response: list[int],
                     autocast: bool = False) -> torch.Tensor:
    """The trainer's log-probs (temperature 1) of ``response`` after ``prompt``: ``[len(response)]``; with
    ``autocast``, under bf16 autocast (``trainer.precision=bf16-mixed``)."""
    device = next(actor.parameters()).device
    ids = torch.tensor([prompt + response], device=device)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[0, len(prompt):] = True
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        logprob, _ = actor_token_outputs(actor, ids, torch.ones_like(ids), mask)
    return logprob[0, len(prompt):].float().cpu()


@torch.no_grad()
def exact_logprobs(actor64: torch.nn.Module, prompt: list[int], response: list[int]) -> torch.Tensor:
    """Float64 log-probs (temperature 1) of ``response`` after ``prompt`` from the model's own forward:
    ``log_softmax(logits[p-1])[token_p]`` with ``actor64`` a float64 copy of the actor, ``[len(response)]``."""
    device = next(actor64.parameters()).device
    ids = torch.tensor([prompt + response], device=device)
    logits = actor64(ids).logits[0, len(prompt) - 1 : -1]  # [len(response), V]
    targets = torch.tensor(response, device=device)[:, None]
    return logits.log_softmax(-1).gather(-1, targets).squeeze(-1).cpu()


def float32_errors(
    actor: torch.nn.Module, prompt_ids: list[list[int]], generations: list[Generation]
) -> tuple[torch.Tensor, torch.Tensor]:
    """How far the engine's and the trainer's float32 log-probs of the generated tokens are from the float64
    ones (:func:`exact_logprobs`): ``(|logprob_engine - exact|, |logprob_trainer - exact|)``, each flat
    ``[total response tokens]``, float64."""
    actor64 = copy.deepcopy(actor).double()
    exact = [exact_logprobs(actor64, p, g.token_ids) for p, g in zip(prompt_ids, generations)]
    engine = torch.cat([(torch.tensor(g.logprobs, dtype=torch.float64) - e).abs() for g, e in zip(generations, exact)])
    trainer = torch.cat([
        (trainer_logprobs(actor, p, g.token_ids).double() - e).abs()
        for p, g, e in zip(prompt_ids, generations, exact)
    ])
    return engine, trainer


def as_exact_as_the_trainer(max_abs_diff: float, engine_error: torch.Tensor, trainer_error: torch.Tensor) -> bool:
    """The CPU float32 bound on the largest ``|logprob_engine - logprob_trainer|``: at most ``CPU_FLOAT32_MAX_TOL``,
    or the engine's largest error against float64 at most ``FLOAT32_ERROR_RATIO`` times the trainer's."""
    return max_abs_diff <= CPU_FLOAT32_MAX_TOL or bool(engine_error.max() <= FLOAT32_ERROR_RATIO * trainer_error.max())


@torch.no_grad()
def perturb_(actor: torch.nn.Module, scale: float = 0.05, seed: int = 0) -> None:
    """An "update": ``scale`` times each weight's std of Gaussian noise on every weight (its own generator)."""
    generator = torch.Generator().manual_seed(seed)
    for p in actor.parameters():
        noise = torch.randn(p.shape, generator=generator, dtype=torch.float32).to(p.device, p.dtype)
        p.add_(scale * p.std() * noise)


def logprob_diffs(actor: torch.nn.Module, prompt_ids: list[list[int]], generations: list[Generation],
                  autocast: bool = False) -> torch.Tensor:
    """``|logprob_engine - logprob_trainer|`` of every generated token (flat, ``[total response tokens]``)."""
    return torch.cat([
        (torch.tensor(g.logprobs) - trainer_logprobs(actor, p, g.token_ids, autocast)).abs()
        for p, g in zip(prompt_ids, generations)
    ])


def sample_and_compare(
    engine: VLLMEngine, actor: torch.nn.Module, prompt_ids: list[list[int]], max_new_tokens: int, autocast: bool = False
) -> tuple[list[Generation], torch.Tensor]:
    """Sample one response per prompt at temperature 1; returns the generations and ``|logprob_vllm -
    logprob_trainer|`` of their tokens (:func:`logprob_diffs`)."""
    sampling = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=max_new_tokens)
    generations = engine.generate(prompt_ids, sampling)
    return generations, logprob_diffs(actor, prompt_ids, generations, autocast)


def check(model_cfg: dict[str, Any], prompts: int = 16, max_new_tokens: int = 64, seed: int = 0,
          gpu_memory_utilization: float = 0.3, bf16_mixed: bool = False,
          shared_instruction: bool = False, engine_dtype: str | None = None) -> dict[str, Any]:
    """Run the check on the ``model`` config; returns the measured differences and ``passed``. ``bf16_mixed``: the
    engine in bfloat16 and the trainer's ``model.dtype`` weights under bf16 autocast (bfloat16's tolerances).
    ``engine_dtype``: the engine's dtype where it is not the trainer's (``rollout.engine.dtype`` alone; its
    tolerances). ``shared_instruction``: every prompt opens with ``SHARED_INSTRUCTION`` (prefix-cached KV blocks)."""
    weights = model_cfg.get("dtype") or "float32"  # the trainer's
    dtype = engine_dtype or ("bfloat16" if bf16_mixed else weights)
    trainer_dtype = "bfloat16 autocast" if bf16_mixed else weights
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = load_tokenizer(model_cfg)
    actor = load_actor(model_cfg).to(device).eval()
    original = {n: p.detach().clone() for n, p in actor.named_parameters()}
    perturb_(actor, seed=seed)
    engine = VLLMEngine(tokenizer, model_cfg, gpu_memory_utilization=gpu_memory_utilization, dtype=dtype, seed=seed)
    engine.sync_weights(actor)
    engine.release_memory()
    engine.sync_weights(actor)
    opening = SHARED_INSTRUCTION if shared_instruction else ""
    texts = [opening + PROMPTS[i % len(PROMPTS)] for i in range(prompts)]
    prompt_ids = [tokenizer(t)["input_ids"] for t in texts]
    generations, diff = sample_and_compare(engine, actor, prompt_ids, max_new_tokens, autocast=bf16_mixed)
    cpu_float32 = (device, dtype, trainer_dtype) == ("cpu", "float32", "float32")  # both stacks in float32
    if cpu_float32:  # before the weights go back: the float64 reference is the pushed weights'
        engine_error, trainer_error = float32_errors(actor, prompt_ids, generations)
    with torch.no_grad():
        for name, p in actor.named_parameters():
            p.copy_(original[name])
    diff_before = logprob_diffs(actor, prompt_ids, generations, autocast=bf16_mixed)
    mean_tol, p99_tol = TOLERANCES[dtype]
    report = {
        "model": model_cfg["name_or_path"], "dtype": dtype, "trainer_dtype": trainer_dtype,
        "shared_instruction": shared_instruction, "device": device,
        "tokens": int(diff.numel()),
        "mean_abs_diff": float(diff.mean()), "p99_abs_diff": float(diff.quantile(0.99)),
        "max_abs_diff": float(diff.max()),
        "mean_abs_diff_vs_checkpoint": float(diff_before.mean()), "mean_tol": mean_tol, "p99_tol": p99_tol,
    }
    if cpu_float32:
        report |= {
            "max_tol": CPU_FLOAT32_MAX_TOL, "float32_error_ratio": FLOAT32_ERROR_RATIO,
            "vllm_max_error_vs_float64": float(engine_error.max()),
            "trainer_max_error_vs_float64": float(trainer_error.max()),
        }
    report["passed"] = (
        report["mean_abs_diff"] <= mean_tol and report["p99_abs_diff"] <= p99_tol
        and (not cpu_float32 or as_exact_as_the_trainer(report["max_abs_diff"], engine_error, trainer_error))
        and report["mean_abs_diff_vs_checkpoint"] >= 2 * report["mean_abs_diff"]
    )
    engine.close()
    return report


def tiny_model_cfg() -> dict[str, Any]:
    """``conf/model/tiny.yaml`` (the tiny model is built under data/ if missing)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(REPO_ROOT / "conf" / "model" / "tiny.yaml"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", help="a model directory or a hub id (default: the tiny model, model=tiny)")
    parser.add_argument("--dtype", default="float32", choices=sorted(TOLERANCES))
    parser.add_argument("--trainer-precision", default="32-true", choices=["32-true", "bf16-mixed"],
                        help="bf16-mixed: vLLM in bfloat16 against the trainer's --dtype weights under bf16 autocast")
    parser.add_argument("--engine-dtype", choices=sorted(TOLERANCES),
                        help="vLLM's dtype where it is not --dtype (the trainer's): rollout.engine.dtype alone")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--shared-instruction", action="store_true",
                        help="every prompt opens with one instruction, read from vLLM's prefix cache after the first")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3, help="GPU only")
    args = parser.parse_args()
    from bench_utils import machine_line

    model_cfg = {"name_or_path": args.model_path} if args.model_path else tiny_model_cfg()
    model_cfg["dtype"] = args.dtype
    report = check(model_cfg, args.prompts, args.max_new_tokens, gpu_memory_utilization=args.gpu_memory_utilization,
                   bf16_mixed=args.trainer_precision == "bf16-mixed", shared_instruction=args.shared_instruction,
                   engine_dtype=args.engine_dtype)
    print(machine_line())
    print(json.dumps(report, indent=2))
    print(f"max_abs_diff {report['max_abs_diff']:.3g}")
    sys.exit(0 if report["passed"] else 1)


if __name__ == "__main__":
    main()
