"""The orchestrator's model and tool-call metrics, driven by a scripted ``Model``: every
outcome of a streamed request is counted once, and tool names it never vouched for fold
into ``other``. (The whole path through real processes: tests/e2e/test_metrics.py.)"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import update

from signalbox.services.orchestrator import metrics
from signalbox.services.orchestrator.model import (
    ModelError,
    ModelEvent,
    ModelRequest,
    StepEnd,
    StepRetry,
    TextDelta,
)
from signalbox.shared.db.models import ToolCall, Turn
from signalbox.shared.tool_contract import ToolResult

from .support import Harness, say, spec, use


class Scripted:
    """A model that streams the given events, then raises ``fail`` if set."""

    name = "scripted"

    def __init__(self, events: list[ModelEvent], fail: Exception | None = None) -> None:
        self.events = events
        self.fail = fail
        self.closed = False

    def stream(self, request: ModelRequest) -> Iterator[ModelEvent]:
        try:
            yield from self.events
            if self.fail is not None:
                raise self.fail
        finally:
            self.closed = True


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
def model_name() -> str:
    return f"model-{uuid.uuid4().hex[:8]}"  # series of this test alone


def test_a_finished_request_counts_its_time_tokens_and_retries(model_name: str) -> None:
    model = Scripted(
        [
            StepRetry(1, "stream broke", input_tokens=5, output_tokens=1),
            TextDelta("hi"),
            StepEnd("end_turn", 10, 3, cache_creation_input_tokens=7, cache_read_input_tokens=2),
        ]
    )
    request = ModelRequest(system="", messages=[], model=model_name)
    assert len(list(metrics.model_stream(model, request, "step"))) == 3
    labels = {"model": model_name, "purpose": "step"}
    assert sample("signalbox_model_requests_total", **labels, outcome="ok") == 1
    assert sample("signalbox_model_request_seconds_count", **labels) == 1
    assert sample("signalbox_model_retries_total", **labels) == 1
    assert sample("signalbox_model_tokens_total", **labels, kind="input") == 15  # both tries
    assert sample("signalbox_model_tokens_total", **labels, kind="output") == 4
    assert sample("signalbox_model_tokens_total", **labels, kind="cache_write") == 7
    assert sample("signalbox_model_tokens_total", **labels, kind="cache_read") == 2


def test_a_failed_request_counts_as_an_error(model_name: str) -> None:
    model = Scripted([TextDelta("hi")], fail=ModelError("overloaded"))
    request = ModelRequest(system="", messages=[], model=model_name)
    with pytest.raises(ModelError):
        list(metrics.model_stream(model, request, "compaction"))
    labels = {"model": model_name, "purpose": "compaction"}
    assert sample("signalbox_model_requests_total", **labels, outcome="error") == 1
    assert sample("signalbox_model_requests_total", **labels, outcome="ok") == 0


def test_a_request_closed_before_its_end_is_cancelled_and_closes_the_models_stream(
    model_name: str,
) -> None:
    model = Scripted([TextDelta("a"), TextDelta("b"), StepEnd("end_turn", 1, 1)])
    request = ModelRequest(system="", messages=[], model=model_name)
    stream = metrics.model_stream(model, request, "planner")
    assert next(stream) == TextDelta("a")
    stream.close()  # what a cancelled step does (model_step.take_step)
    assert model.closed
    labels = {"model": model_name, "purpose": "planner"}
    assert sample("signalbox_model_requests_total", **labels, outcome="cancelled") == 1


def test_tool_names_nobody_vouched_for_are_counted_as_other() -> None:
    made_up = f"tool_{uuid.uuid4().hex[:8]}"
    before = sample("signalbox_tool_calls_total", tool="other", status="error")
    metrics.tool_call_finished(made_up, "error", 0)  # a name the model invented
    assert sample("signalbox_tool_calls_total", tool=made_up, status="error") == 0
    assert sample("signalbox_tool_calls_total", tool="other", status="error") == before + 1
    served = f"served_{uuid.uuid4().hex[:8]}"
    metrics.TOOLS.allow([served])  # what reading the live catalogue does
    metrics.tool_call_finished(served, "timeout", 2500)
    assert sample("signalbox_tool_calls_total", tool=served, status="timeout") == 1
    assert sample("signalbox_tool_call_seconds_sum", tool=served, status="timeout") == 2.5
    metrics.tool_call_finished(served, "denied", None)  # never ran: no duration
    assert sample("signalbox_tool_call_seconds_count", tool=served, status="denied") == 0


QUEUED_S = 30.0  # how long before its start the test says the turn was created
PARKED_S = 90.0  # how long before its resumption the test says the turn parked


def test_a_turn_reports_how_long_it_was_queued_and_how_long_it_stayed_parked(
    harness: Harness,
) -> None:
    """Both waits made long by back-dating (the turn's row, the parked mark), not by sleeping."""
    h = harness
    h.catalogue(spec("run_python", mode="confirm"))
    h.dispatcher.tools["run_python"] = lambda r: ToolResult(call_id=r.call_id, status="ok")
    h.model.steps = [say("Running.", use("run_python", code="1")), say("Done.")]
    turn_id = h.turn("compute")
    with h.sessions() as s, s.begin():
        turn = s.get(Turn, turn_id)
        assert turn is not None
        turn.created_at = turn.created_at - timedelta(seconds=QUEUED_S)
    queued = ("signalbox_turn_queued_seconds_sum", {"user_class": "user"})
    queued_before = REGISTRY.get_sample_value(*queued) or 0.0
    parked_before = sample("signalbox_turn_parked_seconds_count")
    parked_sum_before = sample("signalbox_turn_parked_seconds_sum")

    assert h.run(turn_id) == "parked"
    assert QUEUED_S <= (REGISTRY.get_sample_value(*queued) or 0.0) - queued_before < QUEUED_S + 30
    mark = h.runtime.keys.turn_parked_at(turn_id)
    parked_at = float(h.runtime.redis.get(mark) or 0)
    assert parked_at > 0, "no parked mark"
    h.runtime.redis.set(mark, repr(parked_at - PARKED_S))
    [asked] = h.data("tool_call_needs_decision")
    with h.sessions() as s, s.begin():
        s.execute(update(ToolCall).where(ToolCall.id == asked["call_id"]).values(decision="allow"))

    assert h.run(turn_id) == "completed"
    assert sample("signalbox_turn_parked_seconds_count") == parked_before + 1
    waited = sample("signalbox_turn_parked_seconds_sum") - parked_sum_before
    assert PARKED_S <= waited < PARKED_S + 30
    assert h.runtime.redis.get(mark) is None  # read once, gone
