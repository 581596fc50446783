"""User B against user A's conversation, turn, tool call and proposal: 404 / ``not_found``
on every HTTP route and WebSocket frame that takes an id, and none of A's events."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy.orm import Session, sessionmaker

from signalbox.shared.db import ToolCall, Turn
from signalbox.shared.event_stream import EventStream
from tests import http_calls
from tests.gateway.conftest import (
    LiveGateway,
    ServerThread,
    add_call,
    bearer,
    connect,
    recv,
    request,
)

pytestmark = pytest.mark.anyio

Users = Callable[[], tuple[str, str]]


@dataclass
class Objects:
    """What user A owns."""

    token: str
    conversation_id: str
    turn_id: str
    call_id: str
    proposal_id: str
    workspace: Path


@pytest.fixture
def owned_by_a(
    gw: LiveGateway,
    proposals: ServerThread,
    make_user: Users,
    db_sessions: sessionmaker[Session],
    internal_token: str,
    service_env: dict[str, str],
) -> Objects:
    user_id, token = make_user()
    with http_calls.Client(base_url=gw.url, headers=bearer(token)) as http:
        conversation_id = http.post("/api/conversations", json={}).json()["conversation_id"]
        created_turn = http.post(
            f"/api/conversations/{conversation_id}/turns", json={"text": "A's secret turn"}
        )
        turn_id = created_turn.json()["turn_id"]
    call_id = add_call(db_sessions, turn_id, conversation_id)
    created = http_calls.post(
        f"{proposals.url}/internal/proposals",
        headers={"X-Signalbox-Internal-Token": internal_token},
        json={
            "user_id": user_id,
            "conversation_id": conversation_id,
            "turn_id": turn_id,
            "call_id": call_id,
            "workspace": "default",
            "summary": "A's file",
            "files": [
                {"path": "a.txt", "operation": "create", "after": "A\n", "before_sha256": None}
            ],
        },
    )
    assert created.status_code == 201, created.text
    workspace = Path(service_env["SIGNALBOX_WORKSPACES_ROOT"]).resolve() / user_id / "default"
    return Objects(
        token, conversation_id, turn_id, call_id, created.json()["proposal_id"], workspace
    )


def test_every_http_route_with_an_id_is_404_for_another_user(
    gw: LiveGateway, owned_by_a: Objects, make_user: Users, db_sessions: sessionmaker[Session]
) -> None:
    a = owned_by_a
    _, token_b = make_user()
    routes: list[tuple[str, str, str, dict[str, Any] | None]] = [
        ("GET", "/api/conversations/{}", a.conversation_id, None),
        ("GET", "/api/conversations/{}/events", a.conversation_id, None),
        ("GET", "/api/conversations/{}/stream", a.conversation_id, None),
        ("POST", "/api/conversations/{}/turns", a.conversation_id, {"text": "hijack"}),
        ("POST", "/api/turns/{}/cancel", a.turn_id, None),
        ("POST", "/api/tool-calls/{}/decision", a.call_id, {"decision": "allow"}),
        ("POST", "/api/questions/{}/answer", a.call_id, {"text": "hijack"}),
        ("POST", "/api/tool-calls/{}/result", a.call_id, {"token": "t", "output": "hijack"}),
        ("GET", "/api/proposals/{}", a.proposal_id, None),
        ("POST", "/api/proposals/{}/approve", a.proposal_id, {}),
        ("POST", "/api/proposals/{}/reject", a.proposal_id, {"reason": "no"}),
        ("POST", "/api/proposals/{}/revert", a.proposal_id, {"scope": "turn"}),
    ]
    with http_calls.Client(base_url=gw.url, headers=bearer(token_b)) as b:
        for method, path, object_id, body in routes:
            response = b.request(method, path.format(object_id), json=body)
            assert response.status_code == 404, (method, path, response.text)
            # Word for word what an id that does not exist gets: nothing to probe.
            absent = b.request(method, path.format("absent-id"), json=body)
            assert response.text.replace(object_id, "absent-id") == absent.text
        listed = b.get("/api/conversations").json()
        assert a.conversation_id not in json.dumps(listed)
        pending = b.get("/api/proposals/pending")
        assert pending.status_code == 200
        assert a.proposal_id not in pending.text
    # ... and nothing of A's changed.
    with db_sessions() as session:
        turn = session.get(Turn, a.turn_id)
        call = session.get(ToolCall, a.call_id)
        assert turn is not None and call is not None
        assert not turn.cancel_requested
        assert call.decision is None
    with http_calls.Client(base_url=gw.url, headers=bearer(a.token)) as owner:
        assert owner.get(f"/api/proposals/{a.proposal_id}").json()["status"] == "pending"
        assert owner.get(f"/api/conversations/{a.conversation_id}").status_code == 200
    assert not (a.workspace / "a.txt").exists()


async def test_every_frame_with_an_id_is_not_found_and_no_events_leak(
    gw: LiveGateway,
    owned_by_a: Objects,
    make_user: Users,
    redis_client: redis.Redis,
) -> None:
    a = owned_by_a
    _, token_b = make_user()
    frames: list[dict[str, Any]] = [
        {"type": "subscribe", "conversation_id": a.conversation_id, "after": None},
        {"type": "unsubscribe", "conversation_id": a.conversation_id},
        {"type": "user_turn", "conversation_id": a.conversation_id, "text": "hijack"},
        {"type": "cancel", "turn_id": a.turn_id},
        {"type": "decide_tool", "call_id": a.call_id, "decision": "allow"},
        {"type": "decide_proposal", "proposal_id": a.proposal_id, "decision": "approve"},
        {"type": "decide_proposal", "proposal_id": a.proposal_id, "decision": "reject"},
    ]
    async with await connect(gw, a.token) as ws_a, await connect(gw, token_b) as ws_b:
        own = await request(ws_b, {"type": "user_turn", "text": "B's own turn"})
        assert own["type"] == "ack"
        for frame in frames:
            reply = await request(ws_b, frame)
            assert (reply["type"], reply.get("code")) == ("error", "not_found"), (frame, reply)
        for frame in (
            {"type": "answer", "question_id": a.call_id, "text": "yes"},
            {"type": "tool_result", "call_id": a.call_id, "token": "t", "output": "x"},
        ):
            reply = await request(ws_b, frame)
            assert (reply["type"], reply.get("code")) == ("error", "not_found"), (frame, reply)

        ack = await request(ws_a, {"type": "subscribe", "conversation_id": a.conversation_id})
        assert ack["type"] == "ack"
        marker = EventStream(redis_client, gw.keys).append(
            a.conversation_id, "text_delta", {"text": "for A only"}, a.turn_id
        )
        while (await recv(ws_a)).get("id") != marker:
            pass
        # B's socket: everything it ever got, up to a pong sent after A's marker was out.
        await ws_b.send(json.dumps({"type": "ping", "req": "end"}))
        seen_by_b: list[dict[str, Any]] = []
        while True:
            frame = await recv(ws_b)
            if frame.get("req") == "end":
                break
            seen_by_b.append(frame)
    assert all(f.get("conversation_id") != a.conversation_id for f in seen_by_b)
    assert "for A only" not in json.dumps(seen_by_b)
