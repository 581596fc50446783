"""Cancelling a parked turn wakes it at once; a tool decision after ``expires_at`` is refused."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import pytest
import redis
from sqlalchemy.orm import Session, sessionmaker

from signalbox.shared.db import ToolCall, Turn
from signalbox.shared.event_stream import EventStream
from tests import http_calls
from tests.gateway.conftest import (
    LiveGateway,
    add_call,
    add_turn,
    bearer,
    connect,
    queued_turn_tasks,
    request,
)

pytestmark = pytest.mark.anyio

Users = Callable[[], tuple[str, str]]
T = TypeVar("T")


def row(sessions: sessionmaker[Session], model: type[T], key: str) -> T:
    """The row ``key`` of ``model`` as SQL has it now."""
    with sessions() as session:
        found = session.get(model, key)
    assert found is not None, key
    return found


async def test_cancel_of_a_parked_turn_enqueues_it_over_ws_and_http(
    gateway: LiveGateway,
    make_user: Users,
    conversation_of: Callable[[str], str],
    db_sessions: sessionmaker[Session],
    redis_client: redis.Redis,
) -> None:
    user_id, token = make_user()
    conversation_id = conversation_of(user_id)
    by_ws = add_turn(db_sessions, user_id, conversation_id, "parked")
    by_http = add_turn(db_sessions, user_id, conversation_id, "parked")
    queued = add_turn(db_sessions, user_id, conversation_id, "queued")
    finished = add_turn(db_sessions, user_id, conversation_id, "completed")
    assert queued_turn_tasks(redis_client, gateway.keys) == []

    async with await connect(gateway, token) as ws:
        reply = await request(ws, {"type": "cancel", "turn_id": by_ws})
    assert (reply["type"], reply["status"]) == ("ack", "parked")
    assert queued_turn_tasks(redis_client, gateway.keys) == [("orchestrator.run_turn", [by_ws])]

    async with http_calls.AsyncClient(base_url=gateway.url, headers=bearer(token)) as http:
        for turn_id in (by_http, queued, finished):
            response = await http.post(f"/api/turns/{turn_id}/cancel")
            assert response.status_code == 200, response.text
    # A queued turn is on the broker already and a finished one has nothing to stop.
    assert queued_turn_tasks(redis_client, gateway.keys) == [
        ("orchestrator.run_turn", [by_ws]),
        ("orchestrator.run_turn", [by_http]),
    ]
    flags = {t: row(db_sessions, Turn, t).cancel_requested for t in (by_ws, by_http, finished)}
    assert flags == {by_ws: True, by_http: True, finished: False}


async def test_a_decision_after_expires_at_is_refused_over_ws_and_http(
    gateway: LiveGateway,
    make_user: Users,
    conversation_of: Callable[[str], str],
    db_sessions: sessionmaker[Session],
    redis_client: redis.Redis,
) -> None:
    user_id, token = make_user()
    conversation_id = conversation_of(user_id)
    turn_id = add_turn(db_sessions, user_id, conversation_id, "parked")
    past = datetime.now(UTC) - timedelta(seconds=1)
    future = datetime.now(UTC) + timedelta(minutes=5)
    late_ws = add_call(db_sessions, turn_id, conversation_id, seq=1, expires_at=past)
    late_http = add_call(db_sessions, turn_id, conversation_id, seq=2, expires_at=past)
    # Already expired by the orchestrator: denied, decision "expired".
    swept = add_call(
        db_sessions,
        turn_id,
        conversation_id,
        seq=3,
        expires_at=past,
        status="denied",
        decision="expired",
    )
    in_time = add_call(db_sessions, turn_id, conversation_id, seq=4, expires_at=future)

    async with await connect(gateway, token) as ws:
        for call_id in (late_ws, swept):
            reply = await request(ws, {"type": "decide_tool", "call_id": call_id,
                                       "decision": "allow"})  # fmt: skip
            assert (reply["type"], reply["code"]) == ("error", "conflict"), reply
            assert "expired" in reply["message"] and call_id in reply["message"]
    async with http_calls.AsyncClient(base_url=gateway.url, headers=bearer(token)) as http:
        late = await http.post(f"/api/tool-calls/{late_http}/decision", json={"decision": "allow"})
        ok = await http.post(f"/api/tool-calls/{in_time}/decision", json={"decision": "allow"})
    assert late.status_code == 409
    assert late.json()["code"] == "conflict" and "expired" in late.json()["detail"]
    assert ok.status_code == 200, ok.text

    calls = (late_ws, late_http, swept, in_time)
    decisions = {c: row(db_sessions, ToolCall, c).decision for c in calls}
    assert decisions == {late_ws: None, late_http: None, swept: "expired", in_time: "allow"}
    # Only the decision in time was announced and woke the turn.
    events = EventStream(redis_client, gateway.keys).read_after(conversation_id, None)
    assert [(e.kind, e.data["call_id"]) for e in events] == [("tool_call_decided", in_time)]
    assert queued_turn_tasks(redis_client, gateway.keys) == [("orchestrator.run_turn", [turn_id])]
