"""Keep WebSocket tickets out of the logs: uvicorn logs each handshake's path with its query.

The rules are ``shared/redaction.py``'s, which every handler of ``configure_logging`` applies;
``install`` puts the same filter on uvicorn's loggers too, for an app served without it (the
tests' in-process servers).
"""

from __future__ import annotations

import logging

from signalbox.shared.redaction import REDACTED, RedactSecrets, redact

__all__ = ["REDACTED", "RedactSecrets", "install", "redact"]


def install(logger_names: tuple[str, ...] = ("uvicorn.error", "uvicorn.access")) -> None:
    """Add the filter to uvicorn's loggers (once, however many apps are created)."""
    for name in logger_names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactSecrets) for f in logger.filters):
            logger.addFilter(RedactSecrets())
