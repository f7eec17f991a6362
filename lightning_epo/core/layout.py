"""The files of a run directory (``hydra.run.dir``), named once: the callbacks and the runtime write them, the
reports and resumes read them. (conf/callbacks/default.yaml names the same folders under ``${run_dir}``.)"""

CHECKPOINTS = "checkpoints"  # Lightning checkpoints: last.ckpt and rl_step=K.ckpt
LAST_CHECKPOINT = "last.ckpt"
EVAL = "eval.json"  # mode=eval's metrics
CSV_METRICS = "csv/metrics.csv"  # logger=csv
TURN_ENTROPY = "turn_entropy.jsonl"  # entropy by turn index, every RL step
SAMPLES = "samples.jsonl"  # full episodes, every RL step
EVAL_EPISODES = "eval_episodes.jsonl"  # every evaluation episode's task and outcome (paired comparisons)
MACHINES = "machines.jsonl"  # each start's CPU or GPU and resolved precision (runtime/machine_record.py)
POLICY = "policy"  # export_policy=true: the final actor in Hugging Face format
WARM_START = "warm_start"  # a warm-started run's supervised stage (a run directory of its own)
