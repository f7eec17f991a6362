"""Where an RL step's time goes: seconds per part, the FLOPs the update executes and the machine's matmul peak.

One RL step's parts (DESIGN.md's ``perf/*`` rows): the rollout (``perf/gen_s`` + ``perf/env_s`` + prompt building),
the old-policy pass (``perf/old_logprob_s``, absent where the update's own forward gave the old policy's outputs
(training/micro_batches.py's ``update_fills``), with a critic ``perf/values_s``, with a KL reference
``perf/ref_logprob_s``), the update (``perf/update_s``), the weight push (``perf/weight_sync_s``) and the checkpoint
(``perf/checkpoint_s``); ``perf/step_s`` is the whole step, measured on its own, so the parts can be checked to add
up to it. An evaluation is timed on its own (``perf/eval_s``). On CUDA each part ends with a synchronisation: the
kernels a part launched are counted in it, not in the next; the step's peak memory is ``perf/peak_memory_gib`` and
each timed part's own ``perf/<part>_peak_memory_gib`` (which phase sets the peak: the rollout, or the update). On
every device the host memory is ``perf/host_peak_rss_gib``: the trainer process's largest resident size since it
started (with vLLM in the process, the engine's memory too), on the fullest rank: it rises at the step that needed
more than any before, which a CPU run's memory would otherwise not show until the kernel kills it. Beside it,
``perf/host_released_gib``: the heap memory the update's activations left free, handed back to the system at the
update's end (training/host_memory.py; counted in ``perf/update_s``).
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache

import torch

from lightning_epo.core.metric_names import STEP_PARTS
from lightning_epo.models.lora import decoder_layers, is_lora
from lightning_epo.models.shared_prefix import Sharing
from lightning_epo.training.host_memory import release_free_memory


class StepClock:
    """Seconds per named part of one RL step, summed over the part's intervals (a part may run per micro-batch), and
    the work the update executes (``decoder_positions``, ``logit_positions``: :func:`update_flops`'s inputs)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = {}
        self.decoder_positions = 0
        self.logit_positions = torch.zeros((), device=device)  # a tensor: counting adds no sync per micro-batch
        self.peak_bytes: dict[str, int] = {}  # CUDA: the largest allocation of each part, and of the whole step
        self.host_released_gib: float | None = None  # what a part with hand_back=True gave back (the update)

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def fold_peak(self, name: str | None = None) -> None:
        """CUDA: fold the allocator's peak since its last reset into the step's (and ``name``'s, at a part's end),
        then reset it, so that each part's own peak is read (parts do not nest)."""
        if self.device.type != "cuda":
            return
        peak = torch.cuda.max_memory_allocated(self.device)
        for key in ("step", name) if name else ("step",):
            self.peak_bytes[key] = max(self.peak_bytes.get(key, 0), peak)
        torch.cuda.reset_peak_memory_stats(self.device)

    @contextmanager
    def part(self, name: str, hand_back: bool = False) -> Iterator[None]:
        """Add the time of the ``with`` block (its CUDA kernels included) to ``perf/<name>_s`` and, on CUDA, its
        peak memory to ``perf/<name>_peak_memory_gib``. With ``hand_back`` the block ends by giving the heap's free
        memory back to the system (training/host_memory.py), the GiB kept for ``perf/host_released_gib``."""
        self._synchronize()
        self.fold_peak()
        began = time.perf_counter()
        try:
            yield
            if hand_back:
                self.host_released_gib = release_free_memory()
        finally:
            self._synchronize()
            self.add(name, time.perf_counter() - began)
            self.fold_peak(name)

    def add(self, name: str, seconds: float) -> None:
        """Add ``seconds`` measured elsewhere (the rollout's, the weight push's) to ``perf/<name>_s``."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def count_pass(self, sharing: Sharing, input_ids: torch.Tensor, response_mask: torch.Tensor) -> Sharing:
        """Add an update pass over ``input_ids`` ``[N, L]`` with ``sharing`` to the work counted (the positions its
        decoders compute, ``Sharing.decoder_positions``; the response tokens its output layer sees, summed on the
        device and read once per step); returns ``sharing``, which the pass runs with."""
        self.decoder_positions += sharing.decoder_positions(*input_ids.shape)
        self.logit_positions += response_mask.sum()
        return sharing

    def elapsed(self) -> float:
        """Seconds since the step began."""
        return time.perf_counter() - self.started


def model_flops_per_token(model: torch.nn.Module) -> tuple[float, float]:
    """A forward's FLOPs per position of ``model`` (an actor, or a critic's backbone with its value head), in two
    parts: ``2 * P`` for its ``P`` parameters outside the embeddings and the output layer, and ``2 * d * V`` for the
    output layer (0 without one). Attention's score products and elementwise work are left out (PaLM's convention),
    and a LoRA model counts its base weights (the adapters are a few per mille)."""
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    output_weight = output.weight if output is not None else None
    skip = {id(model.get_input_embeddings().weight), id(output_weight)}
    params = sum(_numel(p) for name, p in model.named_parameters() if id(p) not in skip and "lora_" not in name)
    return 2.0 * params, 2.0 * (_numel(output_weight) if output_weight is not None else 0)


def update_flops(actor: torch.nn.Module, critic: torch.nn.Module | None, decoder_positions: float,
                 logit_positions: float) -> float:
    """The matmul FLOPs an update executes (:func:`model_flops_per_token`): a forward and a backward of the actor and
    (PPO) the critic's backbone over the ``decoder_positions`` its micro-batches computed, summed over its epochs
    (padding included, a shared prefix once, a folded turn's row not at all: ``Sharing.decoder_positions``), and the
    actor's output layer over the ``logit_positions`` (the response tokens) it was applied to. A backward costs two
    forwards where the weights train, one where they are frozen (LoRA's base: input gradients only), none in the
    layers below the lowest one that trains (``model.lora.top_layers``). Counting the batch's tokens instead counted
    work a shared prefix skips, and put the update above the matmul peak."""
    models = [(actor, actor, logit_positions)] + ([(critic, critic.backbone, 0.0)] if critic is not None else [])
    flops = 0.0
    for model, decoder, logits in models:
        body, output = model_flops_per_token(decoder)
        backward = 1.0 if is_lora(model) else 2.0
        flops += (1.0 + backward) * (body * decoder_positions + output * logits)
        flops -= backward * _below_the_trained_layers(decoder) * decoder_positions
    return flops


def _below_the_trained_layers(decoder: torch.nn.Module) -> float:
    """A forward's FLOPs per position of the decoder layers below the lowest one with a parameter that trains: the
    backward pass never reaches them (``model.lora.top_layers``; 0 where the lowest layer trains)."""
    frozen = 0
    for _, layer in decoder_layers(decoder):
        if any(p.requires_grad for p in layer.parameters()):
            break
        frozen += sum(_numel(p) for p in layer.parameters())
    return 2.0 * frozen


def _numel(param: torch.Tensor) -> int:
    """A parameter's size, also where ZeRO-3 holds only this rank's shard of it."""
    return getattr(param, "ds_numel", param.numel())


@cache
def matmul_peak_flops(device_type: str, dtype: torch.dtype) -> float:
    """FLOP/s of a square ``torch.matmul`` at ``dtype`` on this process's threads (CPU) or on the current GPU: the
    physical limit the update's achieved FLOP/s is held against. Measured once per process: about 1 s."""
    size = 8192 if device_type == "cuda" else 1024
    device = torch.device(device_type)
    a, b = (torch.randn(size, size, device=device).to(dtype) for _ in range(2))
    sync = torch.cuda.synchronize if device_type == "cuda" else (lambda: None)
    for _ in range(2):
        a @ b
    sync()
    repeats, began = 5, time.perf_counter()
    for _ in range(repeats):
        a @ b
    sync()
    return 2.0 * size**3 * repeats / (time.perf_counter() - began)


def host_peak_rss_gib() -> float:
    """The largest resident set size this process has had since it started, in GiB (``getrusage``'s
    ``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak * (1 if sys.platform == "darwin" else 1024) / 2**30


def perf_metrics(clock: StepClock, flops: float, peak: float, reduce: Callable[..., torch.Tensor],
                 world_size: int) -> dict[str, float]:
    """RL step k's ``perf/*`` values: the ``clock``'s parts and the whole step in seconds (means over ranks:
    ``reduce`` sums, or with ``"max"`` takes the largest, over ranks), the update's achieved FLOP/s (``flops``:
    :func:`update_flops`) and its share of the matmul ``peak``, and on CUDA the step's peak memory on the fullest
    GPU (its rollout and its update; the counter is reset for the next step) and each timed part's own
    (``perf/update_peak_memory_gib``: the update's; where the step's is larger, the rollout set it); on every device
    the host's, :func:`host_peak_rss_gib` on the fullest rank, and the most any rank's update handed back
    (``perf/host_released_gib``, where the C library can: training/host_memory.py)."""
    seconds = {f"perf/{part}_s": clock.seconds[part] for part in STEP_PARTS if part in clock.seconds}
    seconds["perf/step_s"] = clock.elapsed()
    total = reduce(torch.tensor(list(seconds.values()), device=clock.device)) / world_size
    metrics = dict(zip(seconds, total.tolist()))
    flops_per_s = flops / max(metrics["perf/update_s"], 1e-9)
    metrics |= {"perf/update_flops_per_s": flops_per_s, "perf/update_peak_share": flops_per_s / peak}
    memory = {"perf/host_peak_rss_gib": host_peak_rss_gib()}  # the memory figures: one "max" over ranks
    if clock.host_released_gib is not None:
        memory["perf/host_released_gib"] = clock.host_released_gib
    if clock.device.type == "cuda":
        clock.fold_peak()
        memory |= {f"perf/{'' if part == 'step' else part + '_'}peak_memory_gib": nbytes / 2**30
                   for part, nbytes in clock.peak_bytes.items()}
    largest = reduce(torch.tensor(list(memory.values()), device=clock.device), "max")
    return metrics | dict(zip(memory, largest.tolist()))


PART_LABELS = {"old_logprob": "log-probs", "values": "values", "ref_logprob": "reference"}


def step_line(step: int, seconds: dict[str, float], peak: float) -> str:
    """``step 3 took 45.2 s: rollout 20.1 s (gen 18.0, env 2.1), old policy 5.2 s (log-probs 3.0, values 2.2),
    update 18.3 s at 95 GFLOP/s (83 % of the matmul peak, 115 GFLOP/s), weight push 0.1 s, checkpoint 1.5 s``
    from RL step ``step``'s ``perf/*`` values (``seconds``, :func:`perf_metrics`) and the matmul ``peak``."""
    flops_per_s = seconds["perf/update_flops_per_s"]

    def s(part: str) -> float:
        return seconds.get(f"perf/{part}_s", 0.0)

    old = {label: s(part) for part, label in PART_LABELS.items() if f"perf/{part}_s" in seconds}
    parts = [f"rollout {s('rollout'):.1f} s (gen {s('gen'):.1f}, env {s('env'):.1f})"]
    if old:  # none where the update's own forward gave the old policy's outputs (an on-policy GRPO step)
        parts.append(f"old policy {sum(old.values()):.1f} s ({', '.join(f'{k} {v:.1f}' for k, v in old.items())})")
    parts += [
        f"update {s('update'):.1f} s at {_rate(flops_per_s)} ({100 * flops_per_s / peak:.0f} % of the matmul peak, "
        f"{_rate(peak)})",
        f"weight push {s('weight_sync'):.2f} s",
    ]
    if "perf/checkpoint_s" in seconds:
        parts.append(f"checkpoint {s('checkpoint'):.1f} s")
    if "perf/host_peak_rss_gib" in seconds:
        released = seconds.get("perf/host_released_gib")
        parts.append(f"host memory at most {seconds['perf/host_peak_rss_gib']:.1f} GiB"
                     + (f" ({released:.1f} GiB freed by the update handed back)" if released is not None else ""))
    return f"step {step} took {s('step'):.1f} s: " + ", ".join(parts)


def _rate(flops_per_s: float) -> str:
    return f"{flops_per_s / 1e12:.1f} TFLOP/s" if flops_per_s >= 1e12 else f"{flops_per_s / 1e9:.1f} GFLOP/s"
