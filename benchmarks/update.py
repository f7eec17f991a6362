"""One RL step's update (old-policy pass + PPO epochs): row-count micro-batches, a token budget, a shared prefix and
folded turns.

The batch is real: one rollout step collected from the shipped warm start (``model=tiny_gridworld``) with
``experiment=gridworld_learn``'s settings (32 episodes kept of 128 collected, temperature 0.6). The update runs
the project's own ``EPOModule`` (PPO+EPO, actor and critic) under a Lightning ``Trainer``, with the recipe's
``ppo_epochs=2`` and ``mini_batches=4`` but ``target_kl=null`` (an early stop would end the arms after different
amounts of work). Model (``--model``): ``qwen``, a Qwen2.5-shaped model with random weights: Qwen2.5's vocabulary
(151936, tied embeddings), head size 64, 2 KV heads, MLP 5.5x the hidden size, but ``--hidden`` wide and
``--layers`` deep (a CPU must finish it); or ``recipe``, the recipe's own model (``model=tiny_gridworld``).
Arms, each on the same batch and the same initial weights:

- ``rows``: today's default, ``algo.micro_batch_size=16`` rows in a random order, each micro-batch padded to its
  longest row;
- ``tokens``: ``algo.micro_batch_tokens=--budget``, rows sorted by length and cut by padded size;
- ``rows+prefix``, ``tokens+prefix``: the same with ``model.shared_prefix=true`` (each micro-batch's common
  prefix computed once by actor and critic);
- ``tokens+fold``, ``tokens+prefix+fold``: the token budget (with and without the prefix) and
  ``model.fold_turns=true`` (a row that begins a longer row of its mini-batch, an earlier turn of the same episode,
  is read from that row's forward; the budget counts the rows computed);

With ``--model qwen`` every arm sets ``model.logits_chunk_size=1024``, as the shipped Qwen2.5 configs do.

Reported per arm: the medians of process CPU time (one torch thread: on a shared machine wall time also counts
other jobs' time on the cores) and wall time of ``_old_policy_pass`` + ``_ppo_update``, the peak resident memory
the update added (Linux ``VmHWM`` after resetting it, in one more untimed update per arm with glibc's mmap
threshold fixed and its heap trimmed first, so that freed tensors leave the process), the tokens the decoders
computed (padding included) and the FLOP/s of the update's work: ``2 N`` per real token for a forward pass and
``6 N`` for forward + backward, ``N`` the decoder's parameters without the embedding, for actor and critic, plus the
output layer (``V d``) on response tokens; attention's own products are not counted, and a shared prefix's tokens
count for every row (the work the arm gets done, not the work it does). The peak is a large fp32 matmul timed in
the same process. Arms run in turn, the order reversed on every other repeat.

    python benchmarks/update.py [--model qwen|recipe] [--repeats 2] [--budget 4096] [--hidden 128] [--layers 2]
"""

from __future__ import annotations

import argparse
import ctypes
import tempfile
import time
from pathlib import Path

import bench_utils  # noqa: F401 - puts the repository on sys.path
import hydra
import lightning as L
import torch
from bench_utils import REPO_ROOT, machine_line, median, print_table
from hydra import compose, initialize_config_dir
from torch.utils.data import DataLoader
from transformers import Qwen2Config, Qwen2ForCausalLM

from lightning_epo.callbacks import BetaSchedule, EntropyWindow
from lightning_epo.models.loading import load_actor
from lightning_epo.rollout.batch import RolloutBatch

QWEN_VOCAB = 151936
M_MMAP_THRESHOLD = -3  # glibc mallopt parameter


def compose_cfg(*overrides: str):
    with initialize_config_dir(str(REPO_ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=["experiment=gridworld_learn", "model=tiny_gridworld",
                                            f"run_dir={tempfile.mkdtemp()}", *overrides])


def collect_batch() -> RolloutBatch:
    """One RL step's rows, collected from the shipped warm start with gridworld_learn's data settings."""
    cfg = compose_cfg()
    datamodule = hydra.utils.instantiate(cfg.data)
    datamodule.setup("fit")
    try:
        datamodule.sync_weights(load_actor(cfg.model).eval())
        return datamodule.next_train_batch()
    finally:
        datamodule.teardown("fit")


def qwen_shaped_dir(hidden: int, layers: int, path: Path) -> tuple[int, int, int]:
    """Save a random Qwen2.5-shaped model at ``path``; returns (decoder parameters without embedding, hidden,
    vocabulary)."""
    config = Qwen2Config(vocab_size=QWEN_VOCAB, hidden_size=hidden, intermediate_size=hidden * 11 // 2,
                         num_hidden_layers=layers, num_attention_heads=hidden // 64, num_key_value_heads=2,
                         tie_word_embeddings=True, dtype="float32")
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(path)
    decoder = sum(p.numel() for p in model.model.parameters()) - model.model.embed_tokens.weight.numel()
    return decoder, hidden, QWEN_VOCAB


def rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1])
    raise KeyError(field)


def timed_update(cfg, batch: RolloutBatch) -> dict[str, float]:
    """Fit one RL step of the configured module on ``batch``; CPU / wall seconds and added peak resident memory
    (MiB) of its old-policy pass + PPO update."""
    L.seed_everything(0)
    module = hydra.utils.instantiate(cfg.module)
    record: dict[str, float] = {"cpu_s": 0.0, "wall_s": 0.0}
    for name in ("_old_policy_pass", "_ppo_update"):
        inner = getattr(module, name)

        def wrapper(*args, _inner=inner, _name=name, **kwargs):
            if _name == "_old_policy_pass":
                ctypes.CDLL("libc.so.6").malloc_trim(0)  # earlier arms' freed heap back to the system: RSS is this arm's
                Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
                record["rss_before"] = rss_kib("VmRSS")
            cpu, wall = time.process_time(), time.perf_counter()
            out = _inner(*args, **kwargs)
            record["cpu_s"] += time.process_time() - cpu
            record["wall_s"] += time.perf_counter() - wall
            return out

        setattr(module, name, wrapper)
    trainer = L.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_train_batches=1,
                        callbacks=[EntropyWindow(cfg.algo.epo.window), BetaSchedule(cfg.total_steps, cfg.algo.epo.beta)])
    trainer.fit(module, train_dataloaders=DataLoader([batch], batch_size=None, collate_fn=lambda b: b))
    record["peak_mib"] = (rss_kib("VmHWM") - record.pop("rss_before")) / 1024
    return record


def tokens_computed(module_cfg, batch: RolloutBatch) -> int:
    """Tokens the arm's decoder passes hold, padding included, over the old-policy pass and the PPO epochs
    (actor; the critic computes as many): per micro-batch rows computed x its longest row, or with a shared prefix
    of ``P`` tokens ``P`` + rows computed x (its longest row - ``P``); folded, only the hosts are computed."""
    module = hydra.utils.instantiate(module_cfg)
    module._reduce = lambda t, op="sum": t  # noqa: ARG005 - one process
    lengths = batch.attention_mask.sum(-1)
    generator = torch.Generator().manual_seed(module.hparams.seed * 100_003)  # the update's first RL step
    groups = [[torch.arange(len(batch))]]
    for _ in range(module.algo.ppo_epochs):
        groups.append(list(torch.randperm(len(batch), generator=generator).tensor_split(module.algo.mini_batches)))
    total = 0
    for rows in (rows for group in groups for mbs in module._micro_batches(batch, group) for rows in mbs if len(rows)):
        sharing = module._sharing(batch.select(rows))
        computed = len(rows) if sharing.computed is None else len(sharing.computed)
        total += sharing.prefix + computed * (int(lengths[rows].max()) - sharing.prefix)
    return total


def matmul_peak(n: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of an ``n x n`` fp32 matmul (best of ``repeats``, CPU time)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = min(_cpu_seconds(lambda: a @ b) for _ in range(repeats))
    return 2 * n**3 / best


def _cpu_seconds(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("qwen", "recipe"), default="qwen")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--budget", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(machine_line())

    batch = collect_batch()
    lengths = batch.attention_mask.sum(-1).float()
    response_tokens = int(batch.response_mask.sum())
    print(f"batch: {len(batch)} turn rows, {lengths.min():.0f}-{lengths.max():.0f} tokens (mean {lengths.mean():.0f}), "
          f"{int(lengths.sum())} tokens, {response_tokens} response tokens")

    if args.model == "qwen":
        model_dir = Path(tempfile.mkdtemp()) / "qwen_shaped"
        decoder_params, hidden, vocab = qwen_shaped_dir(args.hidden, args.layers, model_dir)
        base = [f"model.name_or_path={model_dir}", "model.tiny=null", "model.logits_chunk_size=1024"]
        model_line = (f"Qwen2.5-shaped d={hidden} L={args.layers}, {decoder_params / 1e6:.2f}M decoder parameters "
                      f"(+{vocab * hidden / 1e6:.1f}M tied embedding)")
    else:
        actor = load_actor(compose_cfg().model)
        hidden, vocab = actor.config.hidden_size, actor.config.vocab_size
        decoder_params = sum(p.numel() for p in actor.get_decoder().parameters()) - vocab * hidden
        base, model_line = [], f"the recipe's (tiny_gridworld, d={hidden}), {decoder_params / 1e6:.2f}M decoder parameters"
    base += ["algo.target_kl=null", "seed=0", "total_steps=40"]
    tokens, prefix, fold = f"algo.micro_batch_tokens={args.budget}", "model.shared_prefix=true", "model.fold_turns=true"
    arms = {name: compose_cfg(*base, *extra) for name, extra in {
        "rows": [], "tokens": [tokens], "rows+prefix": [prefix], "tokens+prefix": [tokens, prefix],
        "tokens+fold": [tokens, fold], "tokens+prefix+fold": [tokens, prefix, fold],
    }.items()}
    order = [name for i in range(args.repeats) for name in (list(arms) if i % 2 == 0 else list(arms)[::-1])]
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in arms}
    for name in order:
        runs[name].append(timed_update(arms[name], batch))
    # the memory pass: big tensors mmapped and returned when freed, so that VmHWM sees each arm's own peak
    # (its page faults cost system time: these runs are not timed)
    ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, 1 << 20)
    peak_mib = {name: timed_update(cfg, batch)["peak_mib"] for name, cfg in arms.items()}

    epochs = arms["rows"].algo.ppo_epochs
    real = float(lengths.sum())
    flops = 2 * (2 * decoder_params * real) * (1 + 3 * epochs) + 2 * vocab * hidden * response_tokens * (1 + 3 * epochs)
    peak = matmul_peak()
    rows, cpu = [], {name: median([r["cpu_s"] for r in runs[name]]) for name in arms}
    for name, cfg in arms.items():
        computed = tokens_computed(cfg.module, batch)
        rows.append([name, f"{computed} ({computed / (real * (1 + epochs)):.2f}x the real tokens)", cpu[name],
                     median([r["wall_s"] for r in runs[name]]), peak_mib[name],
                     f"{flops / cpu[name] / 1e9:.1f} ({flops / cpu[name] / peak:.0%})", f"{cpu[name] / cpu['rows']:.3f}"])
    print(f"model: {model_line}; budget {args.budget}; matmul peak {peak / 1e9:.1f} GFLOP/s")
    print_table(["arm", "tokens computed", "update CPU s", "update wall s", "peak MiB", "GFLOP/s (of peak)",
                 "CPU time / rows"], rows)
    print(f"update_time_ratio {cpu['tokens+prefix+fold'] / cpu['rows']:.3f} (tokens+prefix+fold / rows)")


if __name__ == "__main__":
    main()
