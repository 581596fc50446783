"""Prometheus metrics of the orchestrator: model requests, tool calls as the turn saw them,
and how long turns waited (queued before they started, parked on a human or a client).

One process (the threads pool), so the metrics live in the default registry, served by
``shared/metrics.py``'s worker server. Nothing here may fail a turn: a metric that cannot be
recorded (Redis down for a parked mark) is skipped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING

import redis
from prometheus_client import Counter, Histogram

from signalbox.services.orchestrator.builtin_tools import BUILTIN_DEFS
from signalbox.services.orchestrator.model import (
    Model,
    ModelEvent,
    ModelRequest,
    StepEnd,
    StepRetry,
)
from signalbox.shared.metrics import LabelCap, user_class
from signalbox.shared.statuses import CallState

if TYPE_CHECKING:
    from signalbox.services.orchestrator.runtime import Runtime
    from signalbox.services.orchestrator.store import Opened

log = logging.getLogger(__name__)

# A deployment's models and tools are a few dozen; past these caps a name is "other".
MAX_MODEL_LABELS = 50
MAX_TOOL_LABELS = 500
# A parked mark outlives any decision or client wait (a parked turn resumes or ends sooner).
PARKED_MARK_TTL_S = 7 * 24 * 3600

MODEL_SECONDS_BUCKETS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
TOOL_SECONDS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
QUEUED_SECONDS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)
PARKED_SECONDS_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0, 86400.0)
# The statuses of a call that ran: its duration is the tool's. (A denied call never ran; a
# lost one's duration is only the orchestrator's deadline.)
RAN = frozenset({CallState.OK, CallState.ERROR, CallState.TIMEOUT})

MODELS = LabelCap(MAX_MODEL_LABELS)
TOOLS = LabelCap(MAX_TOOL_LABELS, BUILTIN_DEFS)  # and the live catalogue's, as read

MODEL_REQUESTS = Counter(
    "signalbox_model_requests",
    "Model requests by model, purpose and outcome (ok, error, cancelled)",
    ["model", "purpose", "outcome"],
)
MODEL_SECONDS = Histogram(
    "signalbox_model_request_seconds",
    "A model request from sent to its last event (streamed; retries included)",
    ["model", "purpose"],
    buckets=MODEL_SECONDS_BUCKETS,
)
MODEL_TOKENS = Counter(
    "signalbox_model_tokens",
    "Tokens as the API reported them, by kind (input, output, cache_read, cache_write)",
    ["model", "purpose", "kind"],
)
MODEL_RETRIES = Counter(
    "signalbox_model_retries",
    "Model streams that broke and were started again",
    ["model", "purpose"],
)
TOOL_CALLS = Counter(
    "signalbox_tool_calls",
    "Tool calls that reached their final status, by tool (unknown names: other) and status",
    ["tool", "status"],
)
TOOL_CALL_SECONDS = Histogram(
    "signalbox_tool_call_seconds",
    "Duration of a tool call that ran (ok, error, timeout), as the orchestrator recorded it",
    ["tool", "status"],
    buckets=TOOL_SECONDS_BUCKETS,
)
TURNS_FINISHED = Counter(
    "signalbox_turns_finished",
    "Turns (and sub-agent turns) ended by this orchestrator, by final status",
    ["status"],
)
TURN_QUEUED_SECONDS = Histogram(
    "signalbox_turn_queued_seconds",
    "From a turn's creation to its start, by user class",
    ["user_class"],
    buckets=QUEUED_SECONDS_BUCKETS,
)
TURN_PARKED_SECONDS = Histogram(
    "signalbox_turn_parked_seconds",
    "How long a turn stayed parked (waiting on a decision, an answer, a client tool)",
    buckets=PARKED_SECONDS_BUCKETS,
)
for _class in ("admin", "user"):
    TURN_QUEUED_SECONDS.labels(_class)  # exported at 0 before the first turn


def model_stream(
    model: Model, request: ModelRequest, purpose: str
) -> Generator[ModelEvent, None, None]:
    """``model.stream(request)``, counted: its duration, outcome, retries and tokens.

    ``purpose``: ``step``, ``sub_agent``, ``planner`` or ``compaction`` (``usage.Purpose``).
    Timing starts when the first event is asked for (that is when the request goes out).
    Closing the returned iterator closes the model's stream.
    """
    name = MODELS.admit(request.model or model.name)
    return _measured(model.stream(request), name, purpose)


def _measured(
    events: Iterator[ModelEvent], model: str, purpose: str
) -> Generator[ModelEvent, None, None]:
    started = time.monotonic()
    outcome = "cancelled"  # closed before its end: a cancel, or the consumer gave up
    try:
        for event in events:
            if isinstance(event, StepRetry):
                MODEL_RETRIES.labels(model, purpose).inc()
                _tokens(model, purpose, event)
            elif isinstance(event, StepEnd):
                outcome = "ok"
                _tokens(model, purpose, event)
            yield event
    except Exception:
        outcome = "error"
        raise
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()
        MODEL_REQUESTS.labels(model, purpose, outcome).inc()
        MODEL_SECONDS.labels(model, purpose).observe(time.monotonic() - started)


def _tokens(model: str, purpose: str, usage: StepEnd | StepRetry) -> None:
    for kind, count in (
        ("input", usage.input_tokens),
        ("output", usage.output_tokens),
        ("cache_read", usage.cache_read_input_tokens),
        ("cache_write", usage.cache_creation_input_tokens),
    ):
        if count:
            MODEL_TOKENS.labels(model, purpose, kind).inc(count)


def tool_call_finished(tool: str, status: str, duration_ms: int | None) -> None:
    """Count a call that reached its final status."""
    label = TOOLS(tool)
    TOOL_CALLS.labels(label, status).inc()
    if status in RAN and duration_ms is not None:
        TOOL_CALL_SECONDS.labels(label, status).observe(duration_ms / 1000)


def turn_started(opened: Opened) -> None:
    """Observe how long a turn that just started was queued."""
    if opened.queued_s is not None:
        TURN_QUEUED_SECONDS.labels(user_class(opened.admin)).observe(opened.queued_s)


def turn_parked(rt: Runtime, turn_id: str) -> None:
    """Mark when a turn parked (in Redis: it may resume in another process)."""
    try:
        rt.redis.set(rt.keys.turn_parked_at(turn_id), repr(time.time()), ex=PARKED_MARK_TTL_S)
    except redis.RedisError as exc:
        log.warning("turn %s: parked mark not set (%r)", turn_id, exc)


def turn_unparked(rt: Runtime, turn_id: str) -> None:
    """Observe how long a turn that resumes just now stayed parked."""
    try:
        raw = rt.redis.getdel(rt.keys.turn_parked_at(turn_id))
    except redis.RedisError as exc:
        log.warning("turn %s: parked mark not read (%r)", turn_id, exc)
        return
    if raw is None:
        return  # parked before this version, or the mark expired
    try:
        parked_at = float(raw)
    except (TypeError, ValueError):
        return
    TURN_PARKED_SECONDS.observe(max(0.0, time.time() - parked_at))
