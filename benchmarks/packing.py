"""Can rows be packed into one sequence (no padding at all) with the attention transformers offers on CPU?

transformers 5.19 packs by ``position_ids``: with ``attention_mask=None``, positions restarting at 0 mark a new
sequence and ``create_causal_mask`` builds a block-diagonal causal mask, for ``sdpa`` and ``eager`` alike
(``masking_utils.find_packed_sequence_indices``); only ``flash_attention_2`` (CUDA) turns it into varlen
kernels. The detection is skipped when a cache exists, and Qwen2 makes one unless ``use_cache=False``.

This script checks that a packed decoder pass gives the padded pass's hidden states, and times forward +
backward of both (process CPU time, best of 3, one thread) on one micro-batch of 8 rows of 146-271 tokens (the
gridworld_learn lengths) through a Qwen2.5-shaped decoder: the packed pass attends over the whole packed
sequence under a dense ``[S, S]`` mask, so it computes more than the padded one.

    python benchmarks/packing.py
"""

from __future__ import annotations

import time

import bench_utils  # noqa: F401 - puts the repository on sys.path
import torch
from bench_utils import machine_line, print_table
from transformers import Qwen2Config, Qwen2ForCausalLM

LENGTHS = [146, 200, 271, 230, 180, 255, 227, 240]


def cpu_seconds(fn) -> float:
    start = time.process_time()
    fn().sum().backward()
    return time.process_time() - start


def main() -> None:
    torch.set_num_threads(1)
    print(machine_line())
    lengths = torch.tensor(LENGTHS)
    ids = torch.randint(3, 2048, (len(LENGTHS), int(lengths.max())))
    mask = (torch.arange(ids.shape[1]) < lengths[:, None]).long()
    packed_ids, positions = ids[mask.bool()][None], (mask.cumsum(-1) - 1)[mask.bool()][None]  # [1, S]
    rows = []
    for impl in ("sdpa", "eager"):
        torch.manual_seed(0)
        decoder = Qwen2ForCausalLM(Qwen2Config(
            vocab_size=2048, hidden_size=256, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, dtype="float32", attn_implementation=impl)).get_decoder()
        padded = lambda: decoder(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state  # noqa: E731
        packed = lambda: decoder(input_ids=packed_ids, position_ids=positions, use_cache=False).last_hidden_state  # noqa: E731
        with torch.no_grad():
            diff = (padded()[mask.bool()] - packed()[0]).abs().max().item()
            cached = decoder(input_ids=packed_ids, position_ids=positions).last_hidden_state[0]
            diff_cached = (padded()[mask.bool()] - cached).abs().max().item()
        t_padded = min(cpu_seconds(padded) for _ in range(3))
        t_packed = min(cpu_seconds(packed) for _ in range(3))
        rows.append([impl, f"{diff:.1e}", f"{diff_cached:.1e}", t_padded, t_packed, t_packed / t_padded])
    print(f"tokens: {int(mask.sum())} real, {mask.numel()} padded")
    print_table(["attention", "max |packed - padded|", "same, cache on", "padded CPU s", "packed CPU s", "packed / padded"],
                rows)


if __name__ == "__main__":
    main()
