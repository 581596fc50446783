"""One logging setup for every Signalbox process: ``configure_logging(service)``.

Called by every entry point: the gateway's and proposals service's ``main()`` (uvicorn is
then told to leave logging alone), every Celery worker through Celery's ``setup_logging``
signal (``celery_logging``: Celery then configures nothing itself, and the embedded beat
and the prefork children inherit the setup), and the ``signalbox`` CLI.

One handler on the root logger, on stderr, so every library's lines come out the same way:

- ``SIGNALBOX_LOG_FORMAT=human`` (the default):
  ``2026-11-24T10:00:00.123Z INFO    orchestrator signalbox.services...: message turn_id=...``
- ``SIGNALBOX_LOG_FORMAT=json``: one object per line with ``ts`` (RFC 3339, UTC), ``level``,
  ``logger``, ``service``, ``message``, ``exc_info`` (the traceback's text) when there is
  one, and the ids of ``shared/log_context.py`` and the OpenTelemetry trace when known.

Every line passes ``shared/redaction.py`` first, with this process's secrets.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

from opentelemetry import trace

from signalbox.shared.log_context import CONTEXT_FIELDS, current_context
from signalbox.shared.redaction import RedactSecrets

LogFormat = Literal["human", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("human", "json")
DEFAULT_LEVEL = "INFO"
# Environment variables whose values are secrets wherever they are set (shared/settings.py).
SECRET_VARIABLES = ("SIGNALBOX_INTERNAL_TOKEN", "ANTHROPIC_API_KEY", "POSTGRES_PASSWORD")
# Chatty at INFO (a line per HTTP request the process makes); they log at WARNING unless the
# level asked for is DEBUG.
# The anthropic SDK's HTTP client is httpx2 (and httpcore2), its own fork of httpx.
QUIET_LOGGERS = (
    "httpx",
    "httpcore",
    "httpx2",
    "httpcore2",
    "mcp.client.streamable_http",
)
TRACE_FIELDS = ("trace_id", "span_id")


def _rfc3339(created: float) -> str:
    return (
        datetime.fromtimestamp(created, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


class ContextFilter(logging.Filter):
    """Puts the ids of ``log_context`` and the current trace on each record, unless the call
    gave its own (``extra={"turn_id": ...}``)."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def filter(self, record: logging.LogRecord) -> bool:
        record.service = self.service
        for name, value in current_context().items():
            if getattr(record, name, None) is None:
                setattr(record, name, value)
        span = trace.get_current_span().get_span_context()
        if span.is_valid and getattr(record, "trace_id", None) is None:
            record.trace_id = format(span.trace_id, "032x")
            record.span_id = format(span.span_id, "016x")
        return True


def _fields(record: logging.LogRecord) -> dict[str, str]:
    fields = {}
    for name in (*CONTEXT_FIELDS, *TRACE_FIELDS):
        value = getattr(record, name, None)
        if value is not None:
            fields[name] = str(value)
    return fields


class HumanFormatter(logging.Formatter):
    """``time level service logger: message key=value...``, then the traceback."""

    def format(self, record: logging.LogRecord) -> str:
        line = (
            f"{_rfc3339(record.created)} {record.levelname:<7} "
            f"{getattr(record, 'service', '-')} {record.name}: {record.getMessage()}"
        )
        fields = _fields(record)
        if fields:
            line += " " + " ".join(f"{k}={v}" for k, v in fields.items())
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line += "\n" + record.exc_text
        if record.stack_info:
            line += "\n" + record.stack_info
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line; a traceback is a string field, never a second line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": _rfc3339(record.created),
            "level": record.levelname,
            "logger": record.name,
            "service": getattr(record, "service", None),
            "message": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exc_info"] = record.exc_text
        if record.stack_info:
            entry["stack_info"] = record.stack_info
        return json.dumps(entry, ensure_ascii=False, default=str)


def _level(value: str | None) -> int:
    name = (value or DEFAULT_LEVEL).strip().upper()
    level = logging.getLevelName(name)
    if not isinstance(level, int):
        raise ValueError(
            f"SIGNALBOX_LOG_LEVEL: expected DEBUG, INFO, WARNING, ERROR or CRITICAL, got {value!r}"
        )
    return level


def _format(value: str | None) -> LogFormat:
    name = (value or "human").strip().lower()
    for known in LOG_FORMATS:
        if name == known:
            return known
    raise ValueError(f"SIGNALBOX_LOG_FORMAT: expected 'human' or 'json', got {value!r}")


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to ``sys.stderr`` as it is at each line, not as it was when configured (a test
    harness replaces it per test; a handler must not keep writing to a closed one)."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass


def make_handler(
    service: str,
    log_format: str | None = None,
    stream: TextIO | None = None,
    secrets: tuple[str, ...] | None = None,
) -> logging.Handler:
    """A handler writing ``service``'s lines in ``log_format`` to ``stream`` (else stderr)."""
    handler: logging.StreamHandler[TextIO] = (
        logging.StreamHandler(stream) if stream is not None else _StderrHandler()
    )
    if secrets is None:
        secrets = tuple(v for v in (os.environ.get(n) for n in SECRET_VARIABLES) if v)
    handler.addFilter(RedactSecrets(secrets))
    handler.addFilter(ContextFilter(service))
    formatter = JsonFormatter() if _format(log_format) == "json" else HumanFormatter()
    handler.setFormatter(formatter)
    handler._signalbox = True  # type: ignore[attr-defined]  # ours: replaced on a second call
    return handler


def configure_logging(
    service: str,
    level: str | None = None,
    log_format: str | None = None,
    stream: TextIO | None = None,
) -> None:
    """Send every logger's lines through one redacting handler in the chosen format.

    ``level`` and ``log_format`` default to ``SIGNALBOX_LOG_LEVEL`` and
    ``SIGNALBOX_LOG_FORMAT``. A second call replaces the first one's handler."""
    level_no = _level(level if level is not None else os.environ.get("SIGNALBOX_LOG_LEVEL"))
    fmt = log_format if log_format is not None else os.environ.get("SIGNALBOX_LOG_FORMAT")
    handler = make_handler(service, fmt, stream)
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_signalbox", False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level_no)
    quiet = level_no if level_no <= logging.DEBUG else max(level_no, logging.WARNING)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(quiet)
    logging.captureWarnings(True)


def celery_logging(service: str, level: str, log_format: str) -> None:
    """Make a Celery worker log through ``configure_logging`` (not Celery's own setup):
    connected to ``setup_logging``, which Celery sends before it would configure any. In
    JSON mode the start-up banner (printed, many lines) gives way to one logged line."""
    from celery.signals import celeryd_after_setup, celeryd_init, setup_logging

    def setup(**_: Any) -> None:
        configure_logging(service, level, log_format)

    def early(instance: Any = None, **_: Any) -> None:
        # Sent before the worker checks its privileges (a warning) and long before it sends
        # setup_logging: its first lines are ours too.
        configure_logging(service, level, log_format)
        if instance is not None and _format(log_format) == "json":
            instance.quiet = True

    def announce(sender: Any = None, instance: Any = None, **_: Any) -> None:
        queues = sorted(instance.app.amqp.queues.consume_from) if instance is not None else []
        logging.getLogger("signalbox.worker").info(
            "worker %s starting: queues %s, concurrency %s",
            sender,
            ",".join(queues),
            getattr(instance, "concurrency", "?"),
        )

    setup_logging.connect(setup, weak=False, dispatch_uid="signalbox-setup-logging")
    celeryd_init.connect(early, weak=False, dispatch_uid="signalbox-early-logging")
    if _format(log_format) == "json":
        celeryd_after_setup.connect(announce, weak=False, dispatch_uid="signalbox-announce")
