"""What ``tool_call_finished`` says about time: ``duration_ms`` is how long the call ran, and
``waited_ms`` (beside it, never added in) how long it waited for a human's decision first.

The wait is made long by back-dating the step in SQL, not by sleeping: the figures are then
what the test chose, plus the test's own running time (``SLACK_S`` allows a loaded machine
plenty of that, and is still far less than the wait it chose).
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update

from signalbox.shared.db.models import Message, ToolCall, Turn
from signalbox.shared.events import ToolCallFinished
from signalbox.shared.tool_contract import ToolCallRequest, ToolResult

from .support import Harness, say, spec, use

WAITED_S = 120.0  # how long ago the test says the call began to wait for its decision
SLACK_S = 60.0  # the test's own time on top of that, however loaded the machine
RAN_MS = 250  # what the tool worker reports as the call's running time


def _ran(request: ToolCallRequest) -> ToolResult:
    return ToolResult(call_id=request.call_id, status="ok", output="42", duration_ms=RAN_MS)


def _asked_earlier(h: Harness, turn_id: str, call_id: str) -> None:
    """The step that asked for the decision was stored ``WAITED_S`` ago; decide ``allow``."""
    with h.sessions() as s, s.begin():
        call = s.get(ToolCall, call_id)
        assert call is not None
        message = s.get(Message, call.message_id)
        assert message is not None
        message.created_at = message.created_at - timedelta(seconds=WAITED_S)


def _decide(h: Harness, call_id: str, decision: str) -> None:
    with h.sessions() as s, s.begin():
        s.execute(update(ToolCall).where(ToolCall.id == call_id).values(decision=decision))


def test_an_allowed_call_reports_its_wait_and_its_running_time_apart(harness: Harness) -> None:
    h = harness
    h.catalogue(spec("run_python", mode="confirm"), spec("list_dir"))
    h.dispatcher.tools.update({"run_python": _ran, "list_dir": _ran})
    h.model.steps = [
        say("Running.", use("run_python", code="print(42)"), use("list_dir", path=".")),
        say("It is 42."),
    ]
    turn_id = h.turn("compute")
    assert h.run(turn_id) == "parked"
    [asked] = h.data("tool_call_needs_decision")
    _asked_earlier(h, turn_id, asked["call_id"])
    _decide(h, asked["call_id"], "allow")

    assert h.run(turn_id) == "completed"

    finished = {d["tool"]: ToolCallFinished.model_validate(d) for d in h.data("tool_call_finished")}
    confirmed, auto = finished["run_python"], finished["list_dir"]
    assert confirmed.duration_ms == RAN_MS
    assert WAITED_S * 1000 <= confirmed.waited_ms < (WAITED_S + SLACK_S) * 1000
    assert (auto.duration_ms, auto.waited_ms) == (RAN_MS, 0)


def test_a_denied_call_never_ran_and_says_how_long_it_waited(harness: Harness) -> None:
    h = harness
    h.catalogue(spec("run_python", mode="confirm"))
    h.model.steps = [say("Running.", use("run_python", code="rm")), say("Understood.")]
    turn_id = h.turn("compute")
    assert h.run(turn_id) == "parked"
    [asked] = h.data("tool_call_needs_decision")
    _asked_earlier(h, turn_id, asked["call_id"])
    _decide(h, asked["call_id"], "deny")

    assert h.run(turn_id) == "completed"

    [finished] = h.data("tool_call_finished")
    assert (finished["status"], finished["duration_ms"]) == ("denied", 0)
    assert WAITED_S * 1000 <= finished["waited_ms"] < (WAITED_S + SLACK_S) * 1000


def test_a_call_cancelled_while_it_waits_for_a_decision_reports_the_wait(
    harness: Harness,
) -> None:
    h = harness
    h.catalogue(spec("run_python", mode="confirm"))
    h.model.steps = [say("Running.", use("run_python", code="1"))]
    turn_id = h.turn("compute")
    assert h.run(turn_id) == "parked"
    [asked] = h.data("tool_call_needs_decision")
    _asked_earlier(h, turn_id, asked["call_id"])
    with h.sessions() as s, s.begin():
        s.execute(update(Turn).where(Turn.id == turn_id).values(cancel_requested=True))

    assert h.run(turn_id) == "cancelled"

    [finished] = h.data("tool_call_finished")
    assert (finished["status"], finished["duration_ms"]) == ("cancelled", 0)
    assert WAITED_S * 1000 <= finished["waited_ms"] < (WAITED_S + SLACK_S) * 1000
