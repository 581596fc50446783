"""Turns that park and resume: confirm decisions (allow, deny, expired), ask_user, client tools,
the tool policy in the loop, and the reconciler waking parked turns. The in-process loop on
real Redis and SQL; answers go through the real gateway app over its WebSocket."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update

from signalbox.services.orchestrator import store
from signalbox.services.orchestrator.policy import ToolPolicy, ToolRule
from signalbox.services.orchestrator.recovery import Reconciler
from signalbox.shared.auth import hash_token
from signalbox.shared.db.models import ToolCall, Turn
from signalbox.shared.settings import GatewaySettings
from tests.fake_anthropic import transcript_problems
from tests.gateway.conftest import LiveGateway
from tests.wsclient import WsClient

from .support import Harness, ok, say, spec, use


def _status(h: Harness, turn_id: str) -> str:
    with h.sessions() as s:
        turn = s.get(Turn, turn_id)
        assert turn is not None
        return turn.status


def _last_results(h: Harness) -> list[dict[str, Any]]:
    """The tool_result blocks of the last request the model got."""
    messages = h.model.requests[-1].messages
    assert transcript_problems(messages) == []
    return [b for b in messages[-1]["content"] if b.get("type") == "tool_result"]


def _reconciler(h: Harness) -> Reconciler:
    return Reconciler(h.sessions, h.runtime.redis, h.runtime.keys, lambda _t: None, 60)


def _time_runs_out(h: Harness, turn_id: str) -> None:
    """The turn's waiting calls (a decision, a client tool) expired a second ago: their
    ``expires_at`` moved into the past in SQL, not waited for, so the test never races a
    short wait on a loaded machine."""
    with h.sessions() as s, s.begin():
        s.execute(
            update(ToolCall)
            .where(ToolCall.turn_id == turn_id, ToolCall.expires_at.is_not(None))
            .values(expires_at=store.utcnow() - timedelta(seconds=1))
        )


@pytest.fixture
def ws(harness: Harness, internal_token: str, tmp_path: Path) -> Iterator[WsClient]:
    """The harness user's WebSocket to a real gateway (uvicorn on a real port) on the
    harness's Redis prefix; not Starlette's in-process client, whose portal could cancel the
    app's relay in teardown."""
    settings = GatewaySettings(
        redis_url=harness.runtime.settings.redis_url,
        redis_prefix=harness.runtime.keys.prefix,
        database_url=harness.runtime.settings.database_url,
        internal_token=internal_token,
        workspaces_root=tmp_path,
    )
    gateway = LiveGateway(settings)
    gateway.start()
    try:
        client = WsClient(gateway.url, harness.token)
        try:
            yield client
        finally:
            client.close()
    finally:
        gateway.stop()


# -- confirm: allow, deny, expired -------------------------------------------------------


def test_confirm_then_allow_over_the_websocket_runs_the_call(
    harness: Harness, ws: WsClient
) -> None:
    h = harness
    h.catalogue(spec("run_python", mode="confirm"))
    h.dispatcher.tools["run_python"] = ok("42")
    h.model.steps = [say("Running.", use("run_python", code="print(42)")), say("It is 42.")]
    turn_id = h.turn("compute")

    assert h.run(turn_id) == "parked"
    [asked] = h.data("tool_call_needs_decision")
    assert asked["expires_at"].endswith("Z")
    assert h.dispatcher.sent == []

    reply = ws.request({"type": "decide_tool", "call_id": asked["call_id"], "decision": "allow"})
    assert reply["type"] == "ack"
    assert h.run(turn_id) == "completed"

    assert [c.status for c in h.calls(turn_id)] == ["ok"]
    assert h.data("tool_call_decided")[0]["decision"] == "allow"
    assert _last_results(h)[0]["content"] == "42"


def test_confirm_then_deny_ends_the_call_denied_and_the_turn_goes_on(
    harness: Harness, ws: WsClient
) -> None:
    h = harness
    h.catalogue(spec("run_python", mode="confirm"))
    h.model.steps = [say("Running.", use("run_python", code="rm")), say("Understood.")]
    turn_id = h.turn("compute")
    assert h.run(turn_id) == "parked"
    [asked] = h.data("tool_call_needs_decision")

    reply = ws.request({"type": "decide_tool", "call_id": asked["call_id"], "decision": "deny"})
    assert reply["type"] == "ack"
    assert h.run(turn_id) == "completed"

    [call] = h.calls(turn_id)
    assert call.status == "denied"
    assert h.dispatcher.sent == []
    [finished] = h.data("tool_call_finished")
    assert finished["status"] == "denied"
    assert _last_results(h)[0]["is_error"] is True


def test_confirm_with_no_decision_expires_and_the_turn_goes_on(harness: Harness) -> None:
    h = harness
    h.catalogue(spec("run_python", mode="confirm"))  # decided within decision_ttl_s (600 s)
    h.model.steps = [say("Running.", use("run_python", code="1")), say("Nobody answered.")]
    turn_id = h.turn("compute")
    assert h.run(turn_id) == "parked"
    assert _reconciler(h).sweep() == [], "a parked turn still in time is left alone"

    _time_runs_out(h, turn_id)
    assert _reconciler(h).sweep() == [turn_id], "the reconciler wakes it once it expired"
    assert h.run(turn_id) == "completed"

    [call] = h.calls(turn_id)
    assert (call.status, call.decision) == ("denied", "expired")
    assert (call.error or "").startswith("expired")
    assert h.data("tool_call_decided") == [{"call_id": call.id, "decision": "expired"}]
    [finished] = h.data("tool_call_finished")
    assert finished["status"] == "denied" and finished["error"].startswith("expired")
    assert "expired" in _last_results(h)[0]["content"]


def test_a_decision_made_while_the_runner_parks_is_not_lost(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness
    h.catalogue(spec("run_python", mode="confirm"))
    turn_id = h.turn("compute")
    h.model.steps = [say("Running.", use("run_python", code="1"))]
    original = store.set_turn_status

    def decided_just_before_parking(sessions: Any, tid: str, status: str, **kw: Any) -> bool:
        if status == "parked":
            # The gateway records a decision now; its enqueue meets this runner's lease.
            with h.sessions() as s, s.begin():
                for call in s.scalars(select(ToolCall).where(ToolCall.turn_id == tid)):
                    call.decision = "deny"
        return original(sessions, tid, status, **kw)

    monkeypatch.setattr(store, "set_turn_status", decided_just_before_parking)

    assert h.run(turn_id) == "parked"

    assert h.enqueued == [turn_id], "the runner enqueues the turn it could not leave parked"


def test_a_cancelled_parked_turn_is_woken_and_cancelled(harness: Harness) -> None:
    h = harness
    h.catalogue(spec("run_python", mode="confirm"))
    h.model.steps = [say("Running.", use("run_python", code="1"))]
    turn_id = h.turn("compute")
    assert h.run(turn_id) == "parked"
    with h.sessions() as s, s.begin():
        s.get(Turn, turn_id).cancel_requested = True  # type: ignore[union-attr]

    assert _reconciler(h).sweep() == [turn_id]
    assert h.run(turn_id) == "cancelled"

    assert [c.status for c in h.calls(turn_id)] == ["cancelled"]


# -- the policy in the loop --------------------------------------------------------------


def test_the_policy_denies_by_pattern_and_allows_by_pattern(harness: Harness) -> None:
    h = harness
    h.runtime.policy = ToolPolicy(
        {
            "run_python": ToolRule(allow=[r'"code": "print\(']),
            "*": ToolRule(deny=[r"\.env\b"]),
        }
    )
    h.catalogue(spec("run_python", mode="confirm"), spec("read_file"))
    h.dispatcher.tools.update({"run_python": ok("hi"), "read_file": ok("x")})
    h.model.steps = [
        say(
            "Three calls.",
            use("run_python", code="print('hi')"),  # allowed by pattern: no decision
            use("read_file", path=".env"),  # denied by the '*' pattern
            use("run_python", code="print(open('.env').read())"),  # deny wins over allow
        ),
        say("Done."),
    ]
    turn_id = h.turn("go")

    assert h.run(turn_id) == "completed"

    assert [c.status for c in h.calls(turn_id)] == ["ok", "denied", "denied"]
    assert h.data("tool_call_needs_decision") == []
    denied = h.calls(turn_id)[1]
    assert "deny pattern" in (denied.error or "")


# -- ask_user ----------------------------------------------------------------------------


def test_ask_user_parks_until_the_answer_and_returns_it(harness: Harness, ws: WsClient) -> None:
    h = harness
    h.model.steps = [
        say("Let me ask.", use("ask_user", question="Tabs or spaces?", options=["tabs", "spaces"])),
        say("Spaces it is."),
    ]
    turn_id = h.turn("format the code")

    assert h.run(turn_id) == "parked"
    [question] = h.data("question")
    assert question["text"] == "Tabs or spaces?" and question["options"] == ["tabs", "spaces"]
    assert {t.name for t in h.model.requests[0].tools} >= {"ask_user", "spawn_agent"}

    reply = ws.request({"type": "answer", "question_id": question["question_id"], "text": "spaces"})
    assert reply["type"] == "ack"
    again = ws.request({"type": "answer", "question_id": question["question_id"], "text": "tabs"})
    assert (again["type"], again["code"]) == ("error", "conflict")
    assert h.data("question_answered") == [{"question_id": question["question_id"]}]
    assert h.run(turn_id) == "completed"

    assert _last_results(h)[0]["content"] == "spaces"
    assert [c.status for c in h.calls(turn_id)] == ["ok"]


def test_ask_user_with_bad_input_gets_an_error_result(harness: Harness) -> None:
    h = harness
    h.model.steps = [say("Asking.", use("ask_user", options=["a"])), say("Sorry.")]
    turn_id = h.turn("go")

    assert h.run(turn_id) == "completed"

    [call] = h.calls(turn_id)
    assert call.status == "error" and "question" in (call.error or "")


# -- client tools ------------------------------------------------------------------------

EDITOR_TOOL = {
    "name": "editor_selection",
    "description": "the text selected in the user's editor",
    "input_schema": {"type": "object"},
    "timeout_s": 30,
}


def test_a_client_tool_answered_with_its_token_resumes_the_turn(
    harness: Harness, ws: WsClient
) -> None:
    h = harness
    h.model.steps = [say("Checking.", use("editor_selection")), say("You selected foo().")]
    turn_id = h.turn("what did I select?", client_tools=[EDITOR_TOOL])

    assert h.run(turn_id) == "parked"
    assert "editor_selection" in {t.name for t in h.model.requests[0].tools}
    [started] = h.data("tool_call_started")
    assert started["executor"] == "client" and started["timeout_s"] == 30
    token, call_id = started["token"], started["call_id"]
    [call] = h.calls(turn_id)
    assert call.token_hash == hash_token(token) and token not in json.dumps(call.input)

    frame = {"type": "tool_result", "call_id": call_id, "output": "foo()", "is_error": False}
    wrong = ws.request({**frame, "token": token + "x"})
    assert (wrong["type"], wrong["code"]) == ("error", "not_found")
    assert ws.request({**frame, "token": token})["type"] == "ack"
    reused = ws.request({**frame, "token": token})
    assert (reused["type"], reused["code"]) == ("error", "not_found")

    assert h.run(turn_id) == "completed"
    [finished] = h.data("tool_call_finished")
    assert (finished["status"], finished["output"]) == ("ok", "foo()")
    assert _last_results(h)[0]["content"] == "foo()"


def test_a_client_tool_never_answered_times_out_and_the_turn_goes_on(harness: Harness) -> None:
    h = harness
    h.model.steps = [say("Checking.", use("editor_selection")), say("No answer from the editor.")]
    turn_id = h.turn("what did I select?", client_tools=[EDITOR_TOOL])  # 30 s to answer
    assert h.run(turn_id) == "parked"
    assert _reconciler(h).sweep() == [], "a client tool still in time is left alone"

    _time_runs_out(h, turn_id)
    assert _reconciler(h).sweep() == [turn_id], "the reconciler wakes it once it timed out"
    assert h.run(turn_id) == "completed"

    [call] = h.calls(turn_id)
    assert (call.status, call.token_hash) == ("timeout", None)
    assert "did not answer" in (call.error or "")
    assert _last_results(h)[0]["is_error"] is True


def test_a_client_cannot_stand_in_for_a_server_tool(harness: Harness) -> None:
    h = harness
    h.catalogue(spec("read_file"))
    h.dispatcher.tools["read_file"] = ok("server's")
    h.model.steps = [say("Reading.", use("read_file", path="a")), say("Read.")]
    turn_id = h.turn("read", client_tools=[{**EDITOR_TOOL, "name": "read_file"}])

    assert h.run(turn_id) == "completed"

    [started] = h.data("tool_call_started")
    assert started["executor"] == "server"
    assert _status(h, turn_id) == "completed"


def test_a_parked_turn_interrupted_by_a_new_one_is_woken_to_end(harness: Harness) -> None:
    h = harness
    h.catalogue(spec("run_python", mode="confirm"))
    h.model.steps = [say("Running.", use("run_python", code="1")), say("The new answer.")]
    first = h.turn("compute", seq=1)
    assert h.run(first) == "parked"
    second = h.turn("never mind, something else", seq=2)
    with h.sessions() as s, s.begin():  # what the gateway's busy policy "interrupt" does
        s.get(Turn, first).cancel_requested = True  # type: ignore[union-attr]

    assert h.run(second) == "waiting"
    assert h.enqueued == [first], "nobody listens to a parked turn's cancel: it is woken"
    assert h.run(first) == "cancelled"
    assert h.enqueued == [first, second]
    assert h.run(second) == "completed"
