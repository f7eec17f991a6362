"""``python train.py`` as a user runs it: bad input fails at start with one clear line."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
from omegaconf import DictConfig

from lightning_epo.core.errors import UserError
from lightning_epo.runtime.run import run
from tests.integration.train_command import REPO, last_line, refused_before_the_run_began, train

BAD_VALUES = [
    (["total_steps=abc"], "total_steps must be an integer >= 1, got 'abc'"),
    (["algo.epo.penalty=square"], "algo.epo.penalty='square' is not valid; choose one of: hinge, indicator"),
    (["ckpt_path=/nonexistent/last.ckpt"], "ckpt_path '/nonexistent/last.ckpt' does not exist"),
    (["stop_at_step=9", "total_steps=3"], "stop_at_step=9 is beyond total_steps=3"),
    (["algo=grpo", "algo.critic=true"], "algo.critic=true is unused with algo.advantage=grpo"),
    (["algo=ppo", "algo.epo.smoothing=true"], "algo.epo.smoothing=true has no effect"),
    (["data.oversample=0"], "data.oversample must be an integer >= 1, got 0"),
    (["data.oversample=1.5"], "data.oversample must be an integer >= 1, got 1.5"),
    (["data.oversample=4", "algo.group_size=1"], "data.oversample=4 needs algo.group_size >= 2"),
    (["optim.actor_lr=abc"], "optim.actor_lr must be a number >= 0"),
    (["data.episodes_per_step=16", "algo.group_size=3"], "data.episodes_per_step=16 is not a multiple of"),
    (["model.trust_remote_code='false'"], "model.trust_remote_code must be true or false (unquoted)"),
    (["rollout=vllm", "+rollout.engine.llm_kwargs.tensor_parallel_size=2"],
     "rollout.engine.llm_kwargs.tensor_parallel_size=2: each trainer rank runs a vLLM engine of its own"),
    (["rollout=vllm", "+rollout.engine.llm_kwargs.pipeline_parallel_size=2"],
     "rollout.engine.llm_kwargs.pipeline_parallel_size=2: each trainer rank runs a vLLM engine of its own"),
]


def refused_at_start(cfg: DictConfig, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run ``cfg`` in this process (``run``, what ``train.py`` calls); the message of the user error it is refused
    with before the run seeds itself (Lightning's ``seed_everything``, right before the data, module and trainer are
    built, fails the test here). The command-line cases below show that ``train.py`` prints it as one line."""

    def run_began(*args, **kwargs):
        raise AssertionError("the run began: the refusal came too late")

    monkeypatch.setattr(L, "seed_everything", run_began)
    with pytest.raises(UserError) as refusal:
        run(cfg)
    return str(refusal.value)


@pytest.mark.parametrize("args,expected", BAD_VALUES)
def test_bad_values_are_refused_at_start_with_the_fix(compose_cfg, monkeypatch, args, expected):
    assert refused_at_start(compose_cfg("experiment=quickstart", *args), monkeypatch).startswith(expected)


@pytest.mark.parametrize("args,expected", [BAD_VALUES[0], BAD_VALUES[2]], ids=["config-value", "checkpoint-path"])
def test_bad_values_fail_at_start_with_one_line(tmp_path, args, expected):
    """The command as a user types it: one line, exit status 2, no stack trace, before the run began."""
    start = time.monotonic()
    result = train(*args, f"hydra.run.dir={tmp_path}")
    assert result.returncode == 2
    assert last_line(result.stderr).startswith(f"error: {expected}")
    assert "Traceback" not in result.stderr
    assert refused_before_the_run_began(tmp_path) and time.monotonic() - start < 60


def test_bad_model_path_names_the_key_to_fix(tmp_path):
    result = train("debug=fast", "model.name_or_path=/nonexistent/model", "model.build_if_missing=false",
                   f"hydra.run.dir={tmp_path}")
    assert result.returncode == 2
    assert last_line(result.stderr) == (
        "error: model path '/nonexistent/model' does not exist: set model.name_or_path to a model directory or a hub id"
    )


@pytest.mark.parametrize(
    "args,fragment",
    [(["no_such_key=1"], "Key 'no_such_key' is not in struct"), (["env=nowhere"], "Could not find 'env/nowhere'")],
)
def test_unknown_options_are_rejected_by_hydra(tmp_path, args, fragment):
    result = train(*args, f"hydra.run.dir={tmp_path}")
    assert result.returncode != 0
    assert fragment in result.stderr and "Traceback" not in result.stderr


def test_a_run_directory_that_cannot_be_written_fails_at_start_with_one_line(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("")
    result = train(f"hydra.run.dir={a_file}/run")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert last_line(result.stderr) == (
        f"error: cannot write the run directory {a_file}/run ({a_file} is not a directory): "
        "set hydra.run.dir=<a writable directory>"
    )


def test_missing_java_is_named_before_any_environment_worker_starts(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"} | {"PATH": str(tmp_path)}  # no java on PATH
    result = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "env=sciworld", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=REPO, capture_output=True, text=True, timeout=300, env=env,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert last_line(result.stderr).startswith("error: env=sciworld needs Java on PATH (or JAVA_HOME)")
    assert len(result.stderr.splitlines()) < 5  # no worker's trace


class _Payload:
    """Unpickling it creates ``marker``: what a malicious checkpoint would run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_checkpoint_with_a_pickled_payload_is_refused_even_when_the_environment_allows_it(tmp_path):
    """``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` turns torch's safe default off; the run passes ``weights_only=True``
    explicitly, so the payload never runs, and the refusal is one line."""
    import torch

    marker, ckpt = tmp_path / "payload-ran", tmp_path / "evil.ckpt"
    torch.save({"pytorch-lightning_version": "2.6.6", "state_dict": {}, "payload": _Payload(marker)}, ckpt)
    env = {**os.environ, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
    done = subprocess.run([sys.executable, str(REPO / "train.py"), "~experiment", "debug=fast", f"ckpt_path={ckpt}",
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env=env)
    assert not marker.exists()
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert last_line(done.stderr).startswith(f"error: ckpt_path '{ckpt}' holds objects that a safe load refuses")


def test_a_torch_file_that_is_not_a_lightning_checkpoint_is_one_line(tmp_path):
    import torch

    ckpt = tmp_path / "weights.pt"
    torch.save({"weight": torch.zeros(2)}, ckpt)
    done = train("~experiment", "debug=fast", f"ckpt_path={ckpt}", f"hydra.run.dir={tmp_path / 'run'}")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert last_line(done.stderr).startswith(f"error: ckpt_path '{ckpt}' is not a Lightning checkpoint")


NO_LOGIN = {"WANDB_API_KEY": None, "WANDB_MODE": None, "NETRC": "{tmp}/netrc", "HOME": "{tmp}"}
NO_HUB = {"HF_HUB_CACHE": "{tmp}/hub", "HF_ENDPOINT": "http://127.0.0.1:9"}  # nothing cached, nothing listens
LATE = [  # each of these used to fail in a traceback after the model was built, or trained doing nothing.
    pytest.param(["model.attn_implementation=flash_attention_2"], "model.attn_implementation=flash_attention_2 needs ",
                 id="flash-attn"),
    pytest.param(["model.max_prompt_tokens=4"], "model.max_prompt_tokens=4 cannot hold the prompt's fixed text",
                 id="prompt-room"),
    pytest.param(["env.eval_splits=[iid,iid]"], "env.eval_splits lists iid twice", id="eval-splits"),
    pytest.param(["trainer.precision=banana"], "trainer.precision='banana' is not valid; choose one of: ",
                 id="precision"),
    pytest.param(["model.dtype=float16"], "model.dtype=float16 cannot train on CPU", id="fp16-cpu"),
    pytest.param(["algo=grpo", "algo.group_size=1"], "algo.group_size=1 with algo.advantage=grpo", id="groups-of-one"),
    pytest.param(["model.tiny.seed=5"], "the tiny model at ", id="tiny-seed"),
]
# On the command line: one case as it is, the two read from the environment when the libraries are imported, which
# only a fresh process shows, and the prompt builder's refusals of its layouts, which Hydra wraps while it
# instantiates the builder (train.py unwraps them).
LATE_ON_THE_COMMAND_LINE = [
    pytest.param(["model.attn_implementation=flash_attention_2"], {},
                 "model.attn_implementation=flash_attention_2 needs ", id="flash-attn"),
    pytest.param(["env=sciworld", "env.prompt.actions_only=true"], {},
                 "env.prompt.actions_only=true shows the earlier actions without their observations, but "
                 "env.history_length=2", id="sciworld-actions-only"),
    pytest.param(["env.prompt.transcript=true"], {}, "env.prompt.transcript=true keeps every earlier turn in the chat, "
                 "which env.history_length=2 would show again", id="transcript-beside-history"),
    pytest.param(["env=sciworld", "env.prompt.fixed_first=false", "env.prompt.action_list=none"], {},
                 "env.prompt.action_list other than full needs env.prompt.fixed_first=true", id="sciworld-layout"),
    pytest.param(["logger=wandb", "logger.offline=false"], NO_LOGIN,
                 "logger=wandb with logger.offline=false needs a W&B login", id="wandb-login"),
    pytest.param(["model=qwen2.5-3b"], NO_HUB,
                 "model.name_or_path=Qwen/Qwen2.5-3B-Instruct is not in the Hugging Face cache", id="hub-offline"),
]


@pytest.mark.parametrize("args,expected", LATE)
def test_what_used_to_fail_late_is_refused_at_start(compose_cfg, monkeypatch, args, expected):
    assert refused_at_start(compose_cfg("debug=fast", *args), monkeypatch).startswith(expected)


@pytest.mark.parametrize("args,env,expected", LATE_ON_THE_COMMAND_LINE)
def test_what_used_to_fail_late_is_refused_at_start_in_one_line(tiny_model_path, tmp_path, args, env, expected):
    """The command as a user types it, in an environment without a W&B login or a hub to reach where the case
    needs one."""
    model = [] if any(a.startswith("model=") for a in args) else [f"model.name_or_path={tiny_model_path}"]
    changes = {name: value and value.format(tmp=tmp_path) for name, value in env.items()}
    run_env = {k: v for k, v in (os.environ | changes).items() if v is not None}
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "~experiment", "debug=fast", *model, *args,
         f"hydra.run.dir={tmp_path / 'run'}"], cwd=REPO, capture_output=True, text=True, timeout=300, env=run_env,
    )
    seconds = time.monotonic() - start
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and len(errors) == 1
    assert last_line(result.stderr).startswith(f"error: {expected}")
    assert refused_before_the_run_began(tmp_path / "run")
    assert seconds < 60, f"refused after {seconds:.1f} s"
