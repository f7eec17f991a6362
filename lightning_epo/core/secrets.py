"""Keep secrets (``WANDB_API_KEY``, hub tokens, passwords) out of anything the run logs or saves.

Only the copies that are saved or logged are scrubbed: the run itself keeps its config (a model loader still
gets a configured token). What counts as a secret:

- a key named like one (``token``, ``hf_token``, ``api_key``, ``secret_key``, ``password`` ...: the word ends
  the key, so ``max_new_tokens`` and ``stop_token_ids`` stay); in ``key=value`` text (a command-line override)
  its value;
- text that looks like a token: ``hf_...`` (Hugging Face), ``sk-...`` (OpenAI-style keys), 40 hex digits
  (wandb API keys; a 40-digit git commit id is redacted too);
- the value of an environment variable named like a secret (``HF_TOKEN``, ``WANDB_API_KEY``, ``*_PASSWORD`` ...).
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

REDACTED = "<redacted>"
_SECRET_NAME = re.compile(
    r"(^|[_\-.])(api_?key|access_?key|secret_?key|private_?key|token|secret|password|passwd|credentials?)$",
    re.IGNORECASE,
)
_SECRET_ENV = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)$")
_MIN_SECRET_LEN = 8  # shorter env values ("1", "true") would redact ordinary config values
_TOKEN_LIKE = re.compile(r"\bhf_[A-Za-z0-9]{20,}|\bsk-[A-Za-z0-9_\-]{16,}|\b[0-9a-f]{40}\b")
_ASSIGNMENT = re.compile(r"([\w.\-]+)=([^,\s]*)")  # key=value, comma-separated in Hydra's override_dirname


def _secret_env_values() -> list[str]:
    """The values of the environment variables named like secrets (long enough not to be a flag)."""
    return [v for k, v in os.environ.items() if _SECRET_ENV.search(k.upper()) and len(v) >= _MIN_SECRET_LEN]


def _scrub_text(text: str, env_secrets: list[str]) -> str:
    """``text`` with secret-named assignments' values, secret environment values and token-like parts redacted."""
    text = _ASSIGNMENT.sub(lambda m: f"{m[1]}={REDACTED}" if _SECRET_NAME.search(m[1]) else m[0], text)
    for secret in env_secrets:
        text = text.replace(secret, REDACTED)
    return _TOKEN_LIKE.sub(REDACTED, text)


def scrub_secrets(value: Any, _env_secrets: list[str] | None = None) -> Any:
    """A copy of a plain config (dicts, lists, scalars) with secret-named keys dropped and secrets in strings
    redacted (see the module docstring)."""
    env_secrets = _secret_env_values() if _env_secrets is None else _env_secrets
    if isinstance(value, dict):
        return {k: scrub_secrets(v, env_secrets) for k, v in value.items() if not _SECRET_NAME.search(str(k))}
    if isinstance(value, (list, tuple)):
        return [scrub_secrets(v, env_secrets) for v in value]
    if isinstance(value, str):
        return _scrub_text(value, env_secrets)
    return value


@contextmanager
def scrubbed_argv() -> Iterator[None]:
    """``sys.argv`` scrubbed while the block runs (wandb records it as the run's ``args``), restored after: a
    DDP launcher that starts the other ranks from ``sys.argv`` later still passes them the real command line."""
    argv = sys.argv
    sys.argv = scrub_secrets(argv)
    try:
        yield
    finally:
        sys.argv = argv


def scrub_saved_config(path: Path) -> None:
    """Rewrite the YAML file ``path`` (a config Hydra saved as typed) scrubbed, when it holds a secret."""
    saved = OmegaConf.to_container(OmegaConf.load(path))
    scrubbed = scrub_secrets(saved)
    if scrubbed != saved:
        OmegaConf.save(OmegaConf.create(scrubbed), path)


def scrub_log_records() -> None:
    """From now on, every log record of the process has its secrets redacted as it is made, whatever handler then
    writes it (Hydra replaces its handlers each time it launches a job). Idempotent."""
    make_record = logging.getLogRecordFactory()
    if getattr(make_record, "scrubs_secrets", False):
        return

    def scrubbed_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # arguments that do not fit the message: the handler reports it
            return record
        scrubbed = _scrub_text(message, _secret_env_values())
        if scrubbed != message:
            record.msg, record.args = scrubbed, None
        return record

    scrubbed_record.scrubs_secrets = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(scrubbed_record)
