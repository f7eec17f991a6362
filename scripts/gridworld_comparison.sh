#!/usr/bin/env bash
# The paper's comparison in miniature (docs/comparison.md):
# one shared supervised warm start, then PPO, PPO+EPO and the ablations x seeds on experiment=gridworld_long,
# JOBS runs at a time (one torch thread each), each run's final policy evaluated on FINAL_EPISODES episodes per
# split into RUN/eval.json (0: no final evaluation), then the figures and the Succ.*/Succ./Eval. tables (evaluations
# after the first RL step: the shared starting level is left out). Rerun it to go on after a stop:
# finished runs and evaluations are skipped, stopped runs resume from their last checkpoint.
#   scripts/gridworld_comparison.sh [OUT_DIR]
#   env: SEEDS="0 1 2" JOBS=2 ALGOS="ppo ppo_epo ..." ARGS="..." FINAL_EPISODES=300
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/gridworld_comparison}
SEEDS=${SEEDS:-"0 1 2"}
JOBS=${JOBS:-2}
ALGOS=${ALGOS:-"ppo ppo_epo ppo_epo_base ppo_epo_const_beta ppo_epo_decay ppo_ea"}
ARGS=${ARGS:-}
FINAL_EPISODES=${FINAL_EPISODES:-300}
PY=${PY:-.venv/bin/python}

if [ ! -f "$OUT/warm_start/policy/config.json" ]; then
  $PY train.py experiment=gridworld_sft export_policy=true logger=csv hydra.run.dir="$OUT/warm_start"
fi
run_command() {  # ALGO SEED [OVERRIDE ...]: the command line of one run; OVERRIDEs come after ARGS and win
  local algo=$1 seed=$2; shift 2
  echo "$PY train.py experiment=gridworld_long algo=$algo seed=$seed warm_start=null model.build_if_missing=false" \
    "model.name_or_path=$OUT/warm_start/policy logger=csv ~callbacks.progress_bar $ARGS $*" \
    "hydra.run.dir=$OUT/$algo/s$seed"
}
for seed in $SEEDS; do      # seed-major: a stopped run of the script leaves every algorithm with the same seeds
  for algo in $ALGOS; do
    run="$OUT/$algo/s$seed"
    [ -f "$run/done" ] && continue                                         # finished
    resume=""; [ -f "$run/checkpoints/last.ckpt" ] && resume="ckpt_path=last"   # stopped: resume exactly
    echo "$(run_command "$algo" "$seed" $resume) >> $OUT/$algo.s$seed.log 2>&1 && touch $run/done"
  done
done | xargs -P "$JOBS" -I{} sh -c "{}"

if [ "$FINAL_EPISODES" -gt 0 ]; then
  for seed in $SEEDS; do for algo in $ALGOS; do
    [ -f "$OUT/$algo/s$seed/eval.json" ] && continue
    echo "$(run_command "$algo" "$seed" mode=eval ckpt_path=last env.val_size="$FINAL_EPISODES")" \
      ">> $OUT/$algo.s$seed.eval.log 2>&1"
  done; done | xargs -P "$JOBS" -I{} sh -c "{}"
fi

RUNS=$(for algo in $ALGOS; do for seed in $SEEDS; do echo "$OUT/$algo/s$seed"; done; done)
$PY -m lightning_epo.reports.plot $RUNS --out "$OUT/figures"
for metric in val/iid/success val/ood/success; do
  $PY -m lightning_epo.reports.summary $RUNS --metric "$metric" --from-step 1 --markdown "$OUT/table_$(echo "$metric" | cut -d/ -f2).md"
done
