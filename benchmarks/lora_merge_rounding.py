"""What a bf16 engine plays after RL with LoRA: the trainer's policy against the merged weights pushed to the engine,
on a run's own checkpoint.

    .venv/bin/python benchmarks/lora_merge_rounding.py RUN_DIR [--turns 4] [--variation 0]

RUN_DIR: an RL run with LoRA adapters (``model.lora``) whose ``checkpoints/last.ckpt`` holds them and whose
``warm_start/policy`` is the base they sit on. Every RL step pushes ``W + ΔW`` (``ΔW = B A alpha / r``) to the engine,
summed in the trainer's float32 and then cast to the engine's dtype (:func:`lightning_epo.models.lora.merged_weights`):
in bf16 a weight moves only by whole bf16 steps, while the trainer adds the adapters' product to the activations.

Tokens: the gold answers (``<action>...</action>`` and the stop token) of one ScienceWorld episode a task of the run's
``env.suite.task_subset``, train variation ``--variation``, its first ``--turns`` turns, each prompt built as the
collector builds it (the run's prompt settings). At each answer token, the next-token distribution (temperature 1) of:

- ``exact``: float32 ``W + ΔW``, float32 compute (the reference);
- ``base``: float32 ``W``: the warm start, before RL;
- ``trainer``: ``W`` with the adapters under bf16 autocast (``trainer.precision=bf16-mixed``'s forward);
- ``engine``: ``bf16(W + ΔW)`` computed in bf16 with transformers (a stand-in for vLLM's bf16 kernels);
- ``engine_base``: ``bf16(W)`` computed the same way: the warm start as a bf16 engine plays it.

Prints, over the answer tokens, the mean ``KL(exact || X)`` and mean ``|log p_exact - log p_X|`` of the gold token for
``X`` in base (what RL changed), trainer and engine, and how much of RL's change the engine carries: the mean
``KL(engine_base || engine)`` against ``KL(base || exact)``, and the least-squares slope and correlation of the gold
token's ``log p_engine - log p_engine_base`` on ``log p_exact - log p_base``. Weight space: the share of adapted
weights whose bf16 value the update left as it was, and ``||bf16(W+ΔW) - bf16(W) - ΔW|| / ||ΔW||``.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf, open_dict

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a plain script
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.bench_utils import machine_line, print_table  # noqa: E402
from benchmarks.sciworld_prompt_tokens import play, prompt_ids  # noqa: E402
from lightning_epo.envs.base import Task  # noqa: E402
from lightning_epo.envs.sciworld import SciWorldEnv, SciWorldSuite  # noqa: E402
from lightning_epo.models.loading import load_actor, load_tokenizer  # noqa: E402
from lightning_epo.models.lora import ADAPTER, lora_layers  # noqa: E402
from lightning_epo.models.weights import gathered_copy  # noqa: E402
from lightning_epo.rollout.expert_engine import ExpertEngine  # noqa: E402
from lightning_epo.rollout.prompts import PromptBuilder  # noqa: E402

ACTOR_PREFIX = "actor."  # the LightningModule's attribute: its state_dict's keys for the policy


def trained_actor(run_dir: Path) -> tuple[torch.nn.Module, dict]:
    """The run's actor in float32: its warm start policy with the adapters of ``checkpoints/last.ckpt``; and its
    config."""
    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    model_cfg = copy.deepcopy(cfg.model)
    with open_dict(model_cfg):
        model_cfg.name_or_path = str(run_dir / "warm_start" / "policy")
        model_cfg.dtype = "float32"
        model_cfg.gradient_checkpointing = False
    actor = load_actor(model_cfg)
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    adapters = {k[len(ACTOR_PREFIX):]: v for k, v in state.items() if k.startswith(ACTOR_PREFIX) and "lora_" in k}
    missing = [k for k, _ in actor.named_parameters() if "lora_" in k and k not in adapters]
    if not adapters or missing:
        raise SystemExit(f"{run_dir}: the checkpoint holds no adapters for {missing[:3] or 'the actor'}")
    actor.load_state_dict(adapters, strict=False)
    return actor.eval(), cfg


def gold_answers(cfg, tokenizer, turns: int, variation: int) -> list[tuple[list[int], list[int]]]:
    """``(prompt ids, answer ids)`` of the first ``turns`` turns of each subset task's gold path, the answer as the
    expert writes it (``ExpertEngine.response_text`` and the stop token)."""
    expert = ExpertEngine(tokenizer, think=cfg.rollout.think)
    builder = PromptBuilder("sciworld", history_length=cfg.env.history_length, think=cfg.rollout.think,
                            fixed_first=cfg.env.prompt.fixed_first, action_list=cfg.env.prompt.action_list)
    suite, env = SciWorldSuite(), SciWorldEnv(gold_path=True)
    rows = []
    try:
        for name in cfg.env.suite.task_subset:
            played = play(env, Task("train", name, suite.variations()[name]["train"][variation]), True, turns, None)
            for prompt, (_, _, action) in zip(prompt_ids(builder, tokenizer, played), played):
                answer = tokenizer.encode(expert.response_text(action), add_special_tokens=False)
                rows.append((prompt, answer + [tokenizer.eos_token_id]))
    finally:
        env.close()
    return rows


@torch.no_grad()
def answer_logprobs(model: torch.nn.Module, rows: list[tuple[list[int], list[int]]], autocast: bool = False
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """The next-token log-probs at every answer token, ``[T, V]`` float64, and the answer tokens ``[T]``."""
    logprobs, targets = [], []
    for prompt, answer in rows:
        ids = torch.tensor([prompt + answer])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]  # [len(answer), V]
        logprobs.append(logits.double().log_softmax(-1))
        targets.append(torch.tensor(answer))
    return torch.cat(logprobs), torch.cat(targets)


def kl(p_log: torch.Tensor, q_log: torch.Tensor) -> torch.Tensor:
    """``KL(p || q)`` per row of two ``[T, V]`` log-prob tables: ``[T]``."""
    return F.kl_div(q_log, p_log, reduction="none", log_target=True).sum(-1)


@torch.no_grad()
def weight_rounding(actor: torch.nn.Module) -> tuple[float, float]:
    """Over the adapted weights: the share whose bf16 value ``W + ΔW`` leaves as ``W``'s, and
    ``||bf16(W+ΔW) - bf16(W) - ΔW|| / ||ΔW||``."""
    unchanged = total = 0
    error = delta_norm = 0.0
    for layer in lora_layers(actor):
        weight = layer.get_base_layer().weight.float()
        delta = layer.get_delta_weight(ADAPTER).float()
        moved = (weight + delta).bfloat16().float() - weight.bfloat16().float()
        unchanged += int((moved == 0).sum())
        total += moved.numel()
        error += float(((moved - delta) ** 2).sum())
        delta_norm += float((delta**2).sum())
    return unchanged / total, (error / delta_norm) ** 0.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--turns", type=int, default=4, help="turns of each task's gold path")
    parser.add_argument("--variation", type=int, default=0, help="which train variation of each task")
    args = parser.parse_args()

    actor, cfg = trained_actor(args.run_dir)
    tokenizer = load_tokenizer(cfg.model)
    rows = gold_answers(cfg, tokenizer, args.turns, args.variation)
    exact = gathered_copy(actor)  # a plain model, W + ΔW summed in the actor's float32
    base = actor.get_base_model()  # the adapters' own forward is skipped under disable_adapter
    logp = {}
    logp["exact"], tokens = answer_logprobs(exact, rows)
    with actor.disable_adapter():
        logp["base"], _ = answer_logprobs(base, rows)
        logp["engine_base"], _ = answer_logprobs(copy.deepcopy(base).to(torch.bfloat16), rows)
    logp["trainer"], _ = answer_logprobs(actor, rows, autocast=True)
    logp["engine"], _ = answer_logprobs(exact.to(torch.bfloat16), rows)

    def gold(name: str) -> torch.Tensor:
        return logp[name].gather(-1, tokens[:, None]).squeeze(-1)

    table = [[name, f"{float(kl(logp['exact'], logp[name]).mean()):.2e}",
              f"{float((gold('exact') - gold(name)).abs().mean()):.2e}"] for name in ("base", "trainer", "engine")]
    learned, carried = gold("exact") - gold("base"), gold("engine") - gold("engine_base")
    slope = float((learned * carried).sum() / (learned**2).sum())
    correlation = float(torch.corrcoef(torch.stack([learned, carried]))[0, 1])
    unchanged, error = weight_rounding(actor)
    print(machine_line())
    print(f"{args.run_dir}: {len(rows)} gold answers, {len(tokens)} answer tokens\n")
    print_table(["against exact (float32 W + ΔW)", "mean KL(exact || X)", "mean |log p gold|"], table)
    print(f"\nRL's change, KL(base || exact) {float(kl(logp['base'], logp['exact']).mean()):.2e}; as the bf16 engine "
          f"plays it, KL(engine_base || engine) {float(kl(logp['engine_base'], logp['engine']).mean()):.2e}")
    print(f"the gold token's log p, engine's change on RL's change: slope {slope:.3f}, correlation {correlation:.3f}")
    print(f"adapted weights whose bf16 value the update left as it was: {unchanged:.3f}; "
          f"||bf16(W+ΔW) - bf16(W) - ΔW|| / ||ΔW|| = {error:.3f}")


if __name__ == "__main__":
    main()
