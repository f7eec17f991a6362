"""A paired comparison of arms of one experiment: arms x seeds, every arm of a seed starting from that seed's one warm
start, each run's final evaluation, and one report.

    python -m lightning_epo.reports.compare PLAN.yaml --out DIR [--python .venv/bin/python]

PLAN.yaml (written down, and committed, before the first run: DESIGN.md "Reproducibility and comparisons")::

    experiment: smollm2_gridworld            # the recipe every run runs, its warm start included
    seeds: [0, 1, 2, 3]
    common: [algo.grpo.norm_by_std=true]     # overrides of every run
    arms:                                    # name: its overrides; the first arm is the baseline
      no_entropy: [algo=grpo]
      epo: [algo=grpo_epo]
      bonus: [algo=grpo_epo, algo.epo.smoothing=false]
    contrasts: [[epo, bonus]]                # optional: pairs of arms also compared with each other
    control: warm_start_only                 # optional: an arm that evaluates each seed's warm start (no RL),
                                             # then the baseline

Runs: ``DIR/<arm>/s<seed>`` (``python train.py experiment=E seed=S COMMON ARM logger=wandb run_group=PLAN-ARM
run_name=ARM-sS hydra.run.dir=...``, one at a time; PLAN is the plan file's name): wandb (offline) shows each arm as
one group, its seeds averaged, the entropy panels of every arm side by side after ``wandb sync
DIR/*/s*/wandb/*run-*``. A seed's warm start runs once, in ``DIR/warm_start/s<seed>``, which each of the seed's runs
sees as its own ``warm_start/`` (a link: lightning_epo/runtime/warm_start.py reuses a policy found there). Arms that
would train different warm starts (an arm that overrides a key the stage inherits, or a prompt setting) are refused
at start. The control, where the plan names one, runs after a seed's arms: ``python train.py mode=eval experiment=E
seed=S COMMON warm_start=null model.name_or_path=DIR/warm_start/s<seed>/policy ...`` (the warm start's policy evaluated
as the arms' final policies are; its ``eval.json`` and ``eval_episodes.jsonl`` are what the report reads), the
baseline of every difference. A run whose checkpoint records it finished is skipped (the control: once its episodes
are recorded); a stopped one resumes (``ckpt_path=last``; a stopped control evaluates again). Run the
command again after a stop; ``--status`` prints where each run stands, with the finished runs' success, and runs
nothing; ``--seeds 0`` runs and reports only those of the plan's seeds (a rule read on seed 0 before the others run).
With ``--keep RECORDS`` (a folder committed with the repository, e.g. ``docs/records/PLAN``) every seed whose runs have
all finished is kept there as soon as they have, before the next seed starts, without checkpoints, and copied back into
``DIR`` at the next start, where it counts as finished: a comparison spread over sessions whose ``DIR`` does not survive
(:mod:`.comparison.records`); where a new arm's run trained such a seed's warm start again, the seed is refused in
one line, and not kept, unless that warm start logged the kept one's SFT losses (the kept runs started from it).
Each run records where it ran and the precision its config resolved to there (``machines.jsonl``): a seed with runs
still to run is refused at start, in one line, where this machine would resolve a run of it to another precision than
the one it recorded (the recipes pick bf16 or float32 by the CPU).

The report (``DIR/report-<PLAN>.md``, and the figures in ``DIR/figures/<PLAN>``: plans may share a folder, and with it
their seeds' warm starts): per arm the final evaluation's success (the last ``val/<split>/success`` of each run), pooled
over seeds with its 95 % Wilson interval (evaluation noise only); per seed each arm's paired difference against the
baseline (and each contrast's: the first arm against the second), over the episodes paired per task where the runs
recorded them (``RUN_DIR/eval_episodes.jsonl``, lightning_epo/callbacks/eval_episodes.py); over seeds, the mean paired
difference with its 95 % Student t-interval (the seed is the unit of pairing), the smallest difference the seeds could
detect at 80 % power, and Newcombe's interval of the pooled difference labelled as evaluation noise only
(:mod:`lightning_epo.reports.paired`); where the environment scores or fails episodes, the final score and the share
of episodes ended by a failure (and within 2 turns) and of those cut at the turn limit without a win, the same way
per seed; the entropy of early and late turns and the share of mixed groups per RL step, overlaid per arm
(``reports.plot``); each run's wall time (``DIR/timings.tsv``); and every run's command.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lightning_epo.core.errors import UserError, exit_with_error
from lightning_epo.reports.comparison.plan import Plan
from lightning_epo.reports.comparison.records import keep_finished, restore_kept
from lightning_epo.reports.comparison.report import report, status
from lightning_epo.reports.comparison.runner import check_one_precision, check_shared_warm_starts, run_all


def compare(plan_path: Path, out: Path, python: str = sys.executable, seeds: list[int] | None = None,
            keep: Path | None = None) -> Path:
    """Run what is missing of the comparison in ``plan_path`` (of its ``seeds`` only, where given) and write its
    report; returns the report's path. With ``keep``, each seed is kept there once its runs have finished (also
    when a run fails), before the next seed starts, and the seeds kept there are copied back first."""
    plan = Plan.read(plan_path)
    plan = plan if seeds is None else plan.with_seeds(seeds)
    out.mkdir(parents=True, exist_ok=True)
    check_shared_warm_starts(plan, out)
    if keep:
        for seed in restore_kept(plan, out, keep):
            print(f"seed {seed}: its finished runs copied back from {keep}", flush=True)
    check_one_precision(plan, out)
    for seed in plan.seeds:  # a seed is kept as soon as it finishes: a session killed in the next loses only that
        try:
            run_all(plan.with_seeds([seed]), out, python)
        finally:
            for kept in keep_finished(plan, out, keep) if keep else []:
                print(f"seed {kept}: its finished runs kept in {keep} (commit them)", flush=True)
    path = out / f"report-{plan.name}.md"
    path.write_text(report(plan, out))
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lightning_epo.reports.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("plan", type=Path, help="PLAN.yaml: experiment, seeds, common overrides, arms")
    parser.add_argument("--out", type=Path, required=True, help="the comparison's folder (runs, report, figures)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter of the runs")
    parser.add_argument("--status", action="store_true",
                        help="print where each run stands (and the finished ones' success), run nothing")
    parser.add_argument("--seeds", type=int, nargs="+",
                        help="run (and report) only these of the plan's seeds: a pause the plan's rule asks for")
    parser.add_argument("--keep", type=Path, metavar="RECORDS",
                        help="keep every finished seed's records in this folder (commit it) and copy them back at the "
                             "next start: for a DIR that does not survive the session")
    args = parser.parse_args(argv)
    try:
        if args.status:
            plan = Plan.read(args.plan)
            plan = plan if args.seeds is None else plan.with_seeds(args.seeds)
            if args.keep:
                restore_kept(plan, args.out, args.keep)
            print(status(plan, args.out), end="")
            return
        print(f"wrote {compare(args.plan, args.out, args.python, args.seeds, args.keep)}")
    except UserError as exc:
        exit_with_error(exc)


if __name__ == "__main__":
    main()
