"""The ids a log line is about (conversation, turn, call, user), carried with the work.

Each is set where it becomes known (``with log_context(turn_id=...)``) and read by the log
formatter (``shared/log_config.py``) on every line written meanwhile, in that thread or
task. A Celery message carries the publisher's ids in one header, restored around the task
that consumes it, so a turn's lines carry its ids from the gateway to the tool workers.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from celery.signals import before_task_publish, task_postrun, task_prerun

CONTEXT_FIELDS = ("conversation_id", "turn_id", "call_id", "user_id")
# The message header that carries the ids over a Celery hop (a JSON object of strings).
CONTEXT_HEADER = "signalbox_log_context"
_MAX_ID_CHARS = 100  # ids are ~30 characters; a header from elsewhere is not trusted further

_EMPTY: Mapping[str, str] = {}
_context: ContextVar[Mapping[str, str]] = ContextVar("signalbox_log_context", default=_EMPTY)


def current_context() -> dict[str, str]:
    """The ids set in this thread or task, by field name."""
    return dict(_context.get())


def _merged(fields: Mapping[str, object]) -> dict[str, str]:
    unknown = set(fields) - set(CONTEXT_FIELDS)
    if unknown:
        raise TypeError(f"expected fields among {CONTEXT_FIELDS}, got {sorted(unknown)!r}")
    merged = dict(_context.get())
    for name, value in fields.items():
        if isinstance(value, str) and value:
            merged[name] = value[:_MAX_ID_CHARS]
    return merged


@contextmanager
def log_context(**fields: str | None) -> Iterator[None]:
    """Add ``fields`` (None or empty: left as they are) to every line logged inside."""
    token = _context.set(_merged(fields))
    try:
        yield
    finally:
        _context.reset(token)


def bind_log_context(**fields: str | None) -> None:
    """Add ``fields`` until the enclosing ``log_context`` (or Celery task) ends."""
    _context.set(_merged(fields))


def _from_header(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        return {}
    return {
        name: value[name][:_MAX_ID_CHARS]
        for name in CONTEXT_FIELDS
        if isinstance(value.get(name), str) and value[name]
    }


def _on_publish(headers: dict[str, Any] | None = None, **_: Any) -> None:
    ids = _context.get()
    if ids and headers is not None:
        headers[CONTEXT_HEADER] = dict(ids)


def _on_prerun(task: Any = None, **_: Any) -> None:
    # A task starts with its message's ids only: a pool thread or process must not keep the
    # ids of the task it ran before.
    request = getattr(task, "request", None)
    header = request.get(CONTEXT_HEADER) if request is not None else None
    _context.set(_from_header(header))


def _on_postrun(**_: Any) -> None:
    _context.set(_EMPTY)


def propagate_over_celery() -> None:
    """Carry the ids in every task this process sends, and restore them in every task it
    runs (idempotent: the signals are connected once per process)."""
    before_task_publish.connect(_on_publish, weak=False, dispatch_uid="signalbox-log-publish")
    task_prerun.connect(_on_prerun, weak=False, dispatch_uid="signalbox-log-prerun")
    task_postrun.connect(_on_postrun, weak=False, dispatch_uid="signalbox-log-postrun")
