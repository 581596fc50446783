"""Keep WebSocket tickets out of the logs: uvicorn logs each handshake's path with its query."""

from __future__ import annotations

import logging
import re

_SECRET_PARAM = re.compile(r"((?:ticket|token)=)[^&\s\"']+", re.IGNORECASE)
REDACTED = "[redacted]"


def redact(text: str) -> str:
    """``text`` with the value of every ``ticket=``/``token=`` query parameter replaced."""
    return _SECRET_PARAM.sub(rf"\g<1>{REDACTED}", text)


class RedactSecrets(logging.Filter):
    """A filter that rewrites a record's message without the secrets it would show."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


def install(logger_names: tuple[str, ...] = ("uvicorn.error", "uvicorn.access")) -> None:
    """Add the filter to uvicorn's loggers (once, however many apps are created)."""
    for name in logger_names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactSecrets) for f in logger.filters):
            logger.addFilter(RedactSecrets())
