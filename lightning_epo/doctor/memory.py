"""What one training process of a run holds in memory, estimated from the model's config.json and the run's
settings (``python -m lightning_epo.doctor``): weights, gradients, optimizer state, activations of one
micro-batch, and the generation engine's share. An estimate to catch an out-of-memory before a queued job
starts, not a measurement: allocator fragmentation, CUDA context (~0.5 GiB) and temporary buffers come on top.

Per parameter, for ``P`` parameters of which ``T`` train (all of them, or LoRA's adapters) on ``N`` ranks:

- plain trainers (``trainer=cpu|gpu|ddp``): weights ``P·b``, gradients ``T·b``, AdamW's two moments ``2·T·b``
  with ``b`` the bytes of ``model.dtype`` (AdamW keeps its state in the parameters' dtype; LoRA's adapters are
  float32, ``b = 4``, on any base, and their own weights ``4·T`` come beside the base's);
- DeepSpeed with bf16: bf16 weights ``2·P`` (ZeRO-3: ``/N``), bf16 gradients ``2·T/N``, fp32 master weights and
  moments ``12·T/N``; at 32-true the same with 4-byte weights and gradients;
- the critic (PPO) a second model of the same size, the KL reference (without LoRA) a third without gradients;
- activations (Korthikanti et al. 2022, with fused attention, no ``s²`` term): about ``34·h`` bytes per token and
  layer at 16 bits (twice at 32), with gradient checkpointing ``2·h`` plus one layer's; the output layer's
  float32 log-softmax ``8·V`` bytes per token (per chunk with ``model.logits_chunk_size``);
- the engine: vLLM's ``gpu_memory_utilization`` share of the GPU (CPU: its weights and ``kv_cache_gib``); the hf
  engine's KV cache for a rollout batch (``2·layers·kv_heads·head_dim·b`` per token), under ZeRO-3 plus its
  full copy of the actor; an evaluation engine of its own (``data.val_engine``) beside it.

Not a bound: on CPU the processes' measured peaks ran 1.5-1.8x the estimate (docs/measurements.md, 2026-12-02).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GIB = 2**30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 2}


@dataclass(frozen=True)
class Shape:
    """What the estimate needs of a decoder's config.json."""

    hidden: int
    layers: int
    vocab: int
    intermediate: int
    heads: int
    kv_heads: int
    tied: bool

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Shape:
        heads = config["num_attention_heads"]
        return cls(
            hidden=config["hidden_size"], layers=config["num_hidden_layers"], vocab=config["vocab_size"],
            intermediate=config["intermediate_size"], heads=heads, kv_heads=config.get("num_key_value_heads", heads),
            tied=bool(config.get("tie_word_embeddings", False)),
        )

    @classmethod
    def from_dir(cls, path: Path) -> Shape:
        return cls.from_config(json.loads((path / "config.json").read_text()))

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def linear_shapes(self) -> list[tuple[int, int]]:
        """``(in, out)`` of one layer's linear maps (attention, gated MLP): LoRA's targets under ``all-linear``."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        return [(h, h), (h, kv), (h, kv), (h, h), (h, self.intermediate), (h, self.intermediate),
                (self.intermediate, h)]

    @property
    def parameters(self) -> int:
        """Decoder weights (biases and norms are a rounding error at these sizes), embeddings and output layer."""
        per_layer = sum(i * o for i, o in self.linear_shapes())
        return self.layers * per_layer + self.vocab * self.hidden * (1 if self.tied else 2)

    def lora_parameters(self, rank: int) -> int:
        return self.layers * sum(rank * (i + o) for i, o in self.linear_shapes())


# The shapes of the hub models the configs name (their config.json), for an estimate before the files are here
KNOWN_SHAPES = {
    "Qwen/Qwen2.5-1.5B-Instruct": Shape(1536, 28, 151936, 8960, 12, 2, True),
    "Qwen/Qwen2.5-3B-Instruct": Shape(2048, 36, 151936, 11008, 16, 2, True),
    "Qwen/Qwen2.5-7B-Instruct": Shape(3584, 28, 152064, 18944, 28, 4, False),
}


@dataclass(frozen=True)
class Estimate:
    """Bytes per training process, by part; ``total`` against ``capacity`` (the device's memory)."""

    parts: dict[str, float]
    capacity: float

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    def describe(self) -> str:
        parts = " + ".join(f"{name} {value / GIB:.1f}" for name, value in self.parts.items() if value >= 0.05 * GIB)
        return f"{parts} = {self.total / GIB:.1f} GiB of {self.capacity / GIB:.1f} GiB"


def estimate(shape: Shape, cfg: Any, world: int, device_bytes: float, on_gpu: bool) -> Estimate:
    """Memory of one training process (rank) of the run ``cfg`` for a model of ``shape`` on ``world`` ranks."""
    model, algo, trainer = cfg.model, cfg.algo, cfg.trainer
    strategy = trainer.get("strategy")
    stage = int(strategy.get("stage", 0)) if hasattr(strategy, "get") else 0
    bf16 = str(trainer.get("precision", "32-true")).startswith("bf16")
    weight_bytes = 2 if stage and bf16 else DTYPE_BYTES.get(str(model.get("dtype") or "float32"), 4)
    params = shape.parameters
    lora_rank = (model.get("lora") or {}).get("r")
    trained = shape.lora_parameters(lora_rank) if lora_rank else params
    models = 2 if algo.get("critic") else 1  # the critic: a second backbone of the same size (value head aside)
    weight_share = 1 / world if stage == 3 else 1
    parts = {"weights": models * params * weight_bytes * weight_share}
    if algo.get("kl_coef", 0) > 0 and not lora_rank:
        parts["weights"] += params * weight_bytes * weight_share  # the frozen reference
    if stage:
        parts["gradients"] = models * trained * weight_bytes / world
        parts["optimizer"] = models * trained * 12 / world  # fp32 master weights + two moments
    else:
        trained_bytes = 4 if lora_rank else weight_bytes  # PEFT keeps adapters in float32 on a 16-bit base
        if lora_rank:
            parts["weights"] += models * trained * trained_bytes  # the adapters themselves, beside the base
        parts["gradients"] = models * trained * trained_bytes
        parts["optimizer"] = models * trained * 2 * trained_bytes
    parts["activations"] = _activations(shape, cfg, weight_bytes)
    engines = [(cfg.rollout.engine, cfg.data.episodes_per_step)]
    if cfg.data.get("val_engine"):  # an evaluation engine of its own, beside the training one
        engines.append((cfg.data.val_engine, cfg.env.val_size))
    parts["engine"] = sum(_engine(shape, engine, episodes, cfg, weight_bytes, stage, device_bytes, on_gpu)
                          for engine, episodes in engines)
    return Estimate(parts, device_bytes)


def _activations(shape: Shape, cfg: Any, weight_bytes: int) -> float:
    """One micro-batch's forward kept for the backward (the largest of actor and critic: they run in turn)."""
    longest_row = cfg.model.max_prompt_tokens + cfg.rollout.max_new_tokens
    budget = cfg.algo.micro_batch_tokens  # a row longer than the budget runs alone
    tokens = max(budget, longest_row) if budget else cfg.algo.micro_batch_size * longest_row
    per_layer = 34 * shape.hidden * weight_bytes / 2
    kept = (2 * shape.hidden * weight_bytes * shape.layers + per_layer) if cfg.model.get("gradient_checkpointing") \
        else per_layer * shape.layers
    logits_rows = min(tokens, cfg.model.get("logits_chunk_size") or tokens)
    return tokens * kept + logits_rows * shape.vocab * 8


def _engine(shape: Shape, engine: Any, episodes: int, cfg: Any, weight_bytes: int, stage: int, device_bytes: float,
            on_gpu: bool) -> float:
    """What the generation ``engine`` (``rollout.engine`` or ``data.val_engine``) of the run ``cfg`` holds, playing
    ``episodes`` at once (the hf engine: at most its ``batch_size``)."""
    target = str(engine.get("_target_", ""))
    if target.endswith("VLLMEngine"):
        if on_gpu:
            return engine.gpu_memory_utilization * device_bytes
        return shape.parameters * DTYPE_BYTES.get(str(engine.get("dtype")), 4) + (engine.get("kv_cache_gib") or 1) * GIB
    if target.endswith("HFEngine"):
        tokens = min(episodes, engine.get("batch_size") or episodes) * (cfg.model.max_prompt_tokens
                                                                         + cfg.rollout.max_new_tokens)
        kv = tokens * 2 * shape.layers * shape.kv_heads * shape.head_dim * weight_bytes
        return kv + (shape.parameters * weight_bytes if stage == 3 else 0)  # ZeRO-3: the engine's full copy
    return 0.0  # the expert engine holds no model
