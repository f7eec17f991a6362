"""Silencing a library's known-harmless log lines where they are logged (runtime/console.py, rollout/vllm_engine.py)."""

from __future__ import annotations

import logging


class DropMessagesStarting(logging.Filter):
    """A logger filter that drops the records whose message starts with ``start``."""

    def __init__(self, start: str) -> None:
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.start)


def silence(logger_name: str, start: str) -> None:
    """Drop ``logger_name``'s records starting with ``start``; called again, it adds nothing (one filter a message)."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, DropMessagesStarting) and f.start == start for f in logger.filters):
        logger.addFilter(DropMessagesStarting(start))
