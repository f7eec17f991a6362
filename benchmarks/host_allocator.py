"""Does the host allocator change a CPU run's speed and memory over its RL steps? The same steps under glibc's malloc
and under jemalloc (preloaded), each arm a fresh ``train.py`` process from the same policy and seed, side by side.

    .venv-vllm/bin/python benchmarks/host_allocator.py --jemalloc /usr/lib/x86_64-linux-gnu/libjemalloc.so.2 \\
        --out outputs/host_allocator -- experiment=smollm2_sciworld seed=1 env.suite.score_reward=10 \\
        total_steps=24 stop_at_step=6 warm_start=null model.name_or_path=W/policy

Each arm runs ``train.py OVERRIDES logger=csv hydra.run.dir=OUT/<arm>`` with this Python, ``LD_PRELOAD`` set to
``--jemalloc`` for the jemalloc arm (and ``MALLOC_CONF`` to ``--malloc-conf`` where given) and removed for glibc's, in
``--order``; an arm whose run directory already holds a metrics log is read back, not run again. Where the run is
deterministic (the same seed, policy and engine) both arms play the same episodes and step k's update does the same
work in both: the table shows that work (TFLOP, the update's seconds times its FLOP/s) beside each arm's update
seconds, step seconds, the process's peak resident size so far (``perf/host_peak_rss_gib``) and what the update's
hand-back freed (``perf/host_released_gib``), and the jemalloc/glibc ratio of the update's seconds per step, with its
mean and a t-interval over the steps (steps of one run are not independent draws: the interval is the spread of the
ratio, not a sampling bound).
docs/real_model.md, "ScienceWorld", has the SmolLM2 figures.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a plain script
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.bench_utils import machine_line, print_table  # noqa: E402
from lightning_epo.reports.paired import seed_interval  # noqa: E402
from lightning_epo.reports.run_history import load_history  # noqa: E402

ARMS = ("glibc", "jemalloc")
FIGURES = ("perf/update_s", "perf/update_flops_per_s", "perf/step_s", "perf/host_peak_rss_gib",
           "perf/host_released_gib")


def arm_env(arm: str, jemalloc: Path, malloc_conf: str | None = None) -> dict[str, str]:
    """This process's environment with ``LD_PRELOAD`` naming ``jemalloc`` (arm ``jemalloc``, with ``MALLOC_CONF``
    set to ``malloc_conf`` where given) or unset (``glibc``)."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF")}
    if arm == "jemalloc":
        env["LD_PRELOAD"] = str(jemalloc)
        if malloc_conf:
            env["MALLOC_CONF"] = malloc_conf
    return env


def run_arm(arm: str, overrides: list[str], out: Path, jemalloc: Path, malloc_conf: str | None) -> Path:
    """Runs ``train.py`` for ``arm`` (unless its run directory has a metrics log); returns the run directory."""
    run_dir = out / arm
    if any(run_dir.glob("csv/**/metrics.csv")):
        print(f"{arm}: {run_dir} has a metrics log: read back, not run", flush=True)
        return run_dir
    command = [sys.executable, str(REPO_ROOT / "train.py"), *overrides, "logger=csv", f"hydra.run.dir={run_dir}"]
    run_dir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(run_dir / "train.log", "w") as log:
        code = subprocess.call(command, cwd=REPO_ROOT, env=arm_env(arm, jemalloc, malloc_conf), stdout=log,
                               stderr=log)
    print(f"{arm}: exit {code} after {time.monotonic() - start:.0f} s ({run_dir / 'train.log'})", flush=True)
    if code != 0:
        sys.exit(f"the {arm} run failed: see {run_dir / 'train.log'}")
    return run_dir


def step_figures(run_dir: Path) -> dict[int, dict[str, float]]:
    """``{rl_step: {figure: value}}`` of the run's logged ``FIGURES``."""
    history = load_history(run_dir)
    steps: dict[int, dict[str, float]] = {}
    for name in FIGURES:
        for step, value in history.get(name, []):
            steps.setdefault(step, {})[name] = value
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jemalloc", type=Path, required=True, help="the libjemalloc.so.2 to preload")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "outputs" / "host_allocator")
    parser.add_argument("--order", nargs=2, choices=ARMS, default=list(ARMS), help="which arm runs first")
    parser.add_argument("--malloc-conf", help="jemalloc's options for its arm (MALLOC_CONF), e.g. oversize_threshold:0")
    parser.add_argument("overrides", nargs="+", help="train.py's overrides (after --)")
    args = parser.parse_args()
    if not args.jemalloc.is_file():
        sys.exit(f"--jemalloc {args.jemalloc} is not a file: install jemalloc (Debian/Ubuntu: apt install "
                 "libjemalloc2) and name its libjemalloc.so.2")
    print(machine_line(), flush=True)
    runs = {arm: step_figures(run_arm(arm, args.overrides, args.out, args.jemalloc, args.malloc_conf))
            for arm in args.order}
    rows, ratios = [], []
    for step in sorted(set(runs["glibc"]) & set(runs["jemalloc"])):
        glibc, jemalloc = runs["glibc"][step], runs["jemalloc"][step]
        if "perf/update_s" not in glibc or "perf/update_s" not in jemalloc:
            continue
        ratio = jemalloc["perf/update_s"] / glibc["perf/update_s"]
        ratios.append(ratio)
        work = [f["perf/update_s"] * f["perf/update_flops_per_s"] / 1e12 for f in (glibc, jemalloc)]
        rows.append([step, f"{work[0]:.2f} / {work[1]:.2f}",
                     *(f"{glibc.get(k, float('nan')):.1f} / {jemalloc.get(k, float('nan')):.1f}"
                       for k in ("perf/update_s", "perf/step_s")),
                     f"{glibc['perf/update_flops_per_s'] / 1e9:.1f} / {jemalloc['perf/update_flops_per_s'] / 1e9:.1f}",
                     *(f"{glibc.get(k, float('nan')):.2f} / {jemalloc.get(k, float('nan')):.2f}"
                       for k in ("perf/host_peak_rss_gib", "perf/host_released_gib")),
                     f"{ratio:.3f}"])
    print(f"overrides: {' '.join(args.overrides)}; order: {' then '.join(args.order)}; jemalloc's MALLOC_CONF: "
          f"{args.malloc_conf or '(its defaults)'}")
    print_table(["RL step", "update TFLOP (glibc / jemalloc)", "update s", "step s", "update GFLOP/s",
                 "peak resident GiB", "handed back GiB", "update s, jemalloc / glibc"], rows)
    if len(ratios) >= 2:
        spread = seed_interval(ratios)
        print(f"update s, jemalloc / glibc over {len(ratios)} steps: mean {spread.mean:.3f}, t-interval "
              f"[{spread.low:.3f}, {spread.high:.3f}]")


if __name__ == "__main__":
    main()
