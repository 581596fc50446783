"""Keep secrets out of the logs: a filter every Signalbox log handler carries.

What is rewritten to ``[redacted]`` (docs/operations.md, "Logging"): the values this process
was given as secrets (the internal token, the Anthropic API key), anything shaped like a
Signalbox API token (``sbt_``), a webhook secret (``whsec_``) or an Anthropic key
(``sk-ant-``), the value of an ``Authorization``, ``X-Api-Key`` or
``X-Signalbox-Internal-Token`` header, ``ticket=`` / ``token=`` (and ``secret=``,
``password=``) query parameters, and the password of a URL (``redis://:pw@host``). The
message, its traceback and its stack are all rewritten before any formatter sees them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

REDACTED = "[redacted]"
MIN_SECRET_CHARS = 8  # a shorter "secret" would redact ordinary words

# Each pattern with the words one of its matches must contain, looked for in the line
# folded as the patterns' IGNORECASE folds it (``_fold``): a line with none of them is not
# searched. Most log lines hold none, and the five searches were a third of what a line cost.
_PATTERNS: tuple[tuple[re.Pattern[str], str, tuple[str, ...]], ...] = (
    # ?ticket=... in the WebSocket and SSE URLs uvicorn logs; token=... in any URL
    (
        re.compile(r"((?:ticket|token|secret|password)=)[^&\s\"'<>]+", re.I),
        rf"\g<1>{REDACTED}",
        ("ticket=", "token=", "secret=", "password="),
    ),
    # a header in any notation: `Authorization: Bearer x`, `'x-api-key': 'x'`, `...=x`
    (
        re.compile(
            r"((?:authorization|x-api-key|x-signalbox-internal-token)[\"']?\s*[:=]\s*[\"']?"
            r"(?:(?:bearer|basic)\s+)?)[^\s\"',;}]+",
            re.I,
        ),
        rf"\g<1>{REDACTED}",
        ("authorization", "x-api-key", "x-signalbox-internal-token"),
    ),
    (re.compile(r"\b(?:sbt|whsec)_[A-Za-z0-9_\-]{8,}"), REDACTED, ("sbt_", "whsec_")),
    (re.compile(r"\bsk-ant-[A-Za-z0-9_\-]{8,}"), REDACTED, ("sk-ant-",)),
    # scheme://user:password@host
    (
        re.compile(r"(\b[a-z][a-z0-9+.\-]*://[^/\s:@]*:)[^@\s/]+@", re.I),
        rf"\g<1>{REDACTED}@",
        ("://",),
    ),
)


def _fold(text: str) -> str:
    """``text`` lower-cased as IGNORECASE compares it: ``casefold`` (which also folds the
    long s and the Kelvin sign), and the dotted and dotless I, which IGNORECASE takes for
    ``i`` where ``casefold`` leaves them apart (``İ`` folds to ``i`` and a combining dot)."""
    return text.casefold().replace("\u0131", "i").replace("i\u0307", "i")


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every secret it shows (the values in ``secrets`` too) replaced."""
    for value in secrets:
        if value in text:
            text = text.replace(value, REDACTED)
    folded = _fold(text)
    for pattern, replacement, words in _PATTERNS:
        if any(word in folded for word in words):
            text = pattern.sub(replacement, text)
    return text


class RedactSecrets(logging.Filter):
    """Rewrites a record's message, traceback and stack without the secrets they would show."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        # Longest first: a secret that contains another is replaced whole.
        self.secrets = tuple(
            sorted({s for s in secrets if len(s) >= MIN_SECRET_CHARS}, key=len, reverse=True)
        )

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: the handler reports it, unredacted args gone
            record.msg, record.args = REDACTED, None
            return True
        cleaned = redact(message, self.secrets)
        if cleaned != message or record.args:
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:
            # The traceback is formatted here, once, so that its text can be rewritten.
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text, self.secrets)
        if record.stack_info:
            record.stack_info = redact(record.stack_info, self.secrets)
        return True
