"""The scrubbing rules of lightning_epo/core/secrets.py: secret-named keys, token-like text, secret environment values."""

from __future__ import annotations

import sys

import pytest

from lightning_epo.core.secrets import REDACTED, scrub_secrets, scrubbed_argv

HF = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567"
SK = "sk-proj-" + "abcDEF0123456789xyz"
WANDB_KEY = "0123456789abcdef" * 2 + "01234567"


@pytest.mark.parametrize("key", ["token", "hf_token", "HF_TOKEN", "api_key", "apikey", "wandb_api_key", "secret",
                                 "client-secret", "secret_key", "aws.access_key", "password", "db_passwd",
                                 "credentials"])
def test_secret_named_keys_are_dropped(key):
    assert scrub_secrets({"model": {key: "anything", "dtype": "float32"}}, []) == {"model": {"dtype": "float32"}}


@pytest.mark.parametrize("key", ["max_new_tokens", "max_prompt_tokens", "edge_tokens", "stop_token_ids", "tokenizer",
                                 "key", "secretary", "passwords_checked"])
def test_ordinary_keys_are_kept(key):
    assert scrub_secrets({key: 12}, []) == {key: 12}


@pytest.mark.parametrize("text,scrubbed", [
    (HF, REDACTED),
    (f"/cache/{HF}/model", f"/cache/{REDACTED}/model"),
    (f"key {SK}.", f"key {REDACTED}."),
    (WANDB_KEY, REDACTED),
    ("+model.password=hunter22,seed=1", f"+model.password={REDACTED},seed=1"),  # Hydra's override_dirname
    ("+model.token=${oc.env:HF_TOKEN}", f"+model.token={REDACTED}"),
])
def test_secrets_in_text_are_redacted(text, scrubbed):
    assert scrub_secrets([text], []) == [scrubbed]


@pytest.mark.parametrize("text", ["hf_home", "sk-1", "desk-lamp-and-chair-configuration", WANDB_KEY[:39],
                                  "0123456789abcdef" * 4, "rl_step=2.ckpt", "algo.epo.kappa_r=2.0"])
def test_ordinary_text_is_kept(text):
    assert scrub_secrets({"a": text}, []) == {"a": text}


def test_values_of_secret_environment_variables_are_redacted(monkeypatch):
    monkeypatch.setenv("MY_SERVICE_PASSWORD", "plain-pass-123")
    monkeypatch.setenv("DEBUG_KEY", "1")  # too short to be a secret: "1" stays everywhere
    cfg = {"notes": "logged in with plain-pass-123", "n": [1, "1"], "steps": (2, 3)}
    assert scrub_secrets(cfg) == {"notes": f"logged in with {REDACTED}", "n": [1, "1"], "steps": [2, 3]}


def test_argv_is_scrubbed_inside_the_block_and_restored_after(monkeypatch):
    argv = ["train.py", f"+model.token={HF}", "seed=1"]
    monkeypatch.setattr(sys, "argv", argv)
    with scrubbed_argv():
        assert sys.argv == ["train.py", f"+model.token={REDACTED}", "seed=1"]
    assert sys.argv is argv


def test_module_saves_hyperparameters_scrubbed_and_keeps_the_token_for_loading(compose_cfg):
    import hydra

    module = hydra.utils.instantiate(compose_cfg(f"+model.token={HF}").module)
    assert "token" not in module.hparams["model"] and "token" not in module.hparams_initial["model"]
    assert module.hparams["model"]["max_prompt_tokens"] == module.model_cfg.max_prompt_tokens
    assert module.model_cfg.token == HF  # what load_actor / load_critic read


def test_the_warm_start_logs_its_stages_command_line_without_secrets(compose_cfg, tmp_path, caplog):
    """A user's ``+model.token=...`` is inherited by the warm start's stage (``inherit: [model, ...]``); the stage's
    command line that the run logs (to the console and train.log) carries it redacted."""
    import logging

    from lightning_epo.runtime.warm_start import run_warm_start

    token = "hf_" + "PlantedWarmStartToken0123456789"
    cfg = compose_cfg("experiment=gridworld_learn")

    def stage(stage_cfg):  # stands for the supervised run: exports its policy
        (tmp_path / "run" / "warm_start" / "policy").mkdir(parents=True)
        (tmp_path / "run" / "warm_start" / "policy" / "config.json").write_text("{}")

    with caplog.at_level(logging.INFO):
        run_warm_start(cfg, [f"+model.token={token}"], run_stage=stage)
    lines = [r.getMessage() for r in caplog.records if "warm start: python train.py" in r.getMessage()]
    assert len(lines) == 1 and "+model.token=" in lines[0] and token not in lines[0]


def test_log_records_are_made_with_their_secrets_redacted(caplog):
    import logging

    from lightning_epo.core.secrets import scrub_log_records

    previous = logging.getLogRecordFactory()
    try:
        scrub_log_records()
        scrub_log_records()  # idempotent: one layer
        with caplog.at_level(logging.INFO):
            logging.getLogger("hydra.launcher").info("\t#%d : %s", 0, f"seed=0 +model.token={HF} algo=grpo")
        assert caplog.records[0].getMessage() == f"\t#0 : seed=0 +model.token={REDACTED} algo=grpo"
        make_record = logging.getLogRecordFactory()  # arguments that do not fit: left for the handler to report
        assert make_record("x", logging.INFO, "f.py", 1, "bad %d", ("not a number",), None).args == ("not a number",)
    finally:
        logging.setLogRecordFactory(previous)
