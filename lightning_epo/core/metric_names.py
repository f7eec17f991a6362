"""The names of the per-RL-step training metrics (DESIGN.md's table), once, for the rollout that measures some of
them and the module that logs them all (lightning_epo/training/step_metrics.py)."""

ROLLOUT_MEANS = (  # per rank over its episodes, averaged over ranks
    "train/reward", "train/success", "train/turns", "train/invalid_action_rate", "train/format_error_rate",
    "train/mixed_groups",
    "train/prompts_shortened",  # the share of turns whose prompt passed model.max_prompt_tokens and was shortened
    "perf/rollout_s", "perf/gen_s", "perf/env_s", "perf/gen_tokens_per_s", "perf/env_steps_per_s",
    "perf/prefix_cache_share",  # only from an engine with a prefix cache (vLLM)
)
# the rest of the RL step, timed by the module and the callbacks (lightning_epo/training/step_clock.py): perf/<part>_s
STEP_PARTS = ("old_logprob", "values", "ref_logprob", "update", "weight_sync", "checkpoint")
ROLLOUT_COUNTS = ("train/env_failures",)  # summed over ranks
LOSS_TERMS = ("policy", "entropy", "smooth", "value", "kl", "total")  # loss/<term>, where the run has the term
PANELS = ("early_turns", "late_turns", "early_tokens", "late_tokens")  # entropy/<panel> (paper Fig. 1, Fig. 7d)
PROGRESS_BAR = {"train/success": "success", "loss/total": "loss"}  # logged with prog_bar=True: name -> the bar's label
# per evaluation and split, val/<split>/<name>: means over episodes (success, reward, turns) and over turns (the share
# of turns that paid the invalid-action penalty, of answers not in the format, the answers' generated tokens)
VAL_METRICS = ("success", "reward", "turns", "invalid_action_rate", "format_error_rate", "response_tokens")
# per evaluation, logged beside them: the episodes a split's val/<split>/success is a rate over, summed over ranks
# (the 95 % interval of lightning_epo/reports/summary.py needs it)
EVAL_EPISODES = "val/{split}/episodes"
# per evaluation and split where the environment scores its episodes (ScienceWorld: env.scored), and per task where
# the suite names a task subset (env.suite.task_subset); logged only for what had episodes (never NaN)
VAL_SCORE = "val/{split}/score"          # mean score at the episode's end, 0-100; a failed task (-100) counts 0
TASK_METRICS = ("success", "score")      # val/<split>/task/<task name>/<name>
VAL_TASK = "val/{split}/task/{task}/{name}"
