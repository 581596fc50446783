"""The JSON Schema of the WebSocket protocol is current, and real frames of a real turn fit it;
every timestamp a real turn puts on the wire, in its events and HTTP answers, has one format.

The turn runs on the shared ``stack`` (every service a real process, the offline demo
model) over a raw WebSocket, so what is checked is what went over the wire, not what the
SDK made of it.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import jsonschema  # no stubs: ignore_missing_imports in pyproject.toml
import pytest
from websockets.sync.client import connect

from signalbox.client import ws_url
from signalbox.shared.protocol_schema import SCHEMA_PATH, protocol_schema, render
from signalbox.shared.timestamps import RFC3339_PATTERN
from signalbox.stack import Stack
from tests import http_calls
from tests.conftest import _user_factory

TURN_TIMEOUT_S = 60.0
TIMESTAMP = re.compile(RFC3339_PATTERN)
# A field that holds a moment: ``ts``, or a name ending ``_at`` (created_at, expires_at...).
MOMENT_KEY = re.compile(r"^(ts|.+_at)$")
# A value that looks like a moment, whatever its key: a date, then a time.
MOMENT_LIKE = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}")


@dataclass
class Wire:
    """What a real turn put on the wire."""

    sent: list[dict[str, Any]] = field(default_factory=list)  # client frames
    received: list[dict[str, Any]] = field(default_factory=list)  # server frames
    http: dict[str, Any] = field(default_factory=dict)  # route -> JSON body


@pytest.fixture(scope="module")
def wire(stack: Stack, stack_sessions: Any) -> Iterator[Wire]:
    """One turn that looks around and proposes a file, approved over HTTP, then read back."""
    user_id, token = _user_factory(stack_sessions)()
    (stack.config.workspaces_root / user_id / "default").mkdir(parents=True)
    seen = Wire()
    headers = {"Authorization": f"Bearer {token}"}
    with connect(ws_url(stack.gateway_url), additional_headers=headers) as ws:

        def send(frame: dict[str, Any]) -> None:
            seen.sent.append(frame)
            ws.send(json.dumps(frame))

        send({"type": "ping", "req": "p1"})
        send({"type": "user_turn", "req": "t1", "text": "look around and create hello.txt"})
        deadline = time.monotonic() + TURN_TIMEOUT_S
        while True:
            frame = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            seen.received.append(frame)
            if frame.get("kind") == "turn_finished":
                break
        last = frame
        resume = {"conversation_id": last["conversation_id"], "after": last["id"]}
        send({"type": "subscribe", "req": "s1", **resume})  # nothing left to replay: an ack
        send({"type": "decide_tool", "req": "d1", "call_id": "call_none", "decision": "allow"})
        for _ in range(2):  # the ack, then the error (not_found)
            seen.received.append(json.loads(ws.recv(timeout=10)))
    events = [f for f in seen.received if f["type"] == "event"]
    conversation_id = events[0]["conversation_id"]
    [proposal_id] = [e["data"]["proposal_id"] for e in events if e["kind"] == "proposal_created"]
    with http_calls.Client(base_url=stack.gateway_url, headers=headers) as http:
        for name, method, path in (
            ("approve", "POST", f"/api/proposals/{proposal_id}/approve"),
            ("proposal", "GET", f"/api/proposals/{proposal_id}"),
            ("conversations", "GET", "/api/conversations"),
            ("conversation", "GET", f"/api/conversations/{conversation_id}"),
            ("events", "GET", f"/api/conversations/{conversation_id}/events"),
            ("activity", "GET", "/api/activity"),
        ):
            response = http.request(method, path)
            assert response.status_code == 200, (path, response.text)
            seen.http[name] = response.json()
    yield seen


def moments(value: Any, where: str = "") -> Iterator[tuple[str, str]]:
    """(where, text) of every timestamp-looking string in a JSON value, any depth."""
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, str) and (MOMENT_KEY.match(key) or MOMENT_LIKE.match(item)):
                yield f"{where}.{key}", item
            else:
                yield from moments(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from moments(item, f"{where}[{i}]")
    elif isinstance(value, str) and MOMENT_LIKE.match(value):
        yield where, value


def validator(schema: dict[str, Any], root: str) -> Any:
    """A validator of one of the schema's two roots (``ClientFrame``, ``ServerFrame``)."""
    return jsonschema.Draft202012Validator({"$defs": schema["$defs"], "$ref": f"#/$defs/{root}"})


def test_the_committed_schema_is_the_one_the_models_generate() -> None:
    assert SCHEMA_PATH.read_text(encoding="utf-8") == render(), (
        "docs/protocol.schema.json is stale: run `python -m signalbox.shared.protocol_schema`"
    )


def test_the_schema_is_valid_json_schema_and_refuses_what_the_server_refuses() -> None:
    schema = protocol_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    client = validator(schema, "ClientFrame")
    assert client.is_valid({"type": "user_turn", "text": "hi"})
    assert not client.is_valid({"type": "user_turn", "text": ""})  # min_length 1
    assert not client.is_valid({"type": "decide_tool", "call_id": "c", "decision": "maybe"})
    assert not client.is_valid({"type": "no_such_frame"})


def test_every_frame_of_a_real_turn_fits_the_schema(wire: Wire) -> None:
    schema = protocol_schema()
    client = validator(schema, "ClientFrame")
    server = validator(schema, "ServerFrame")
    for frame in wire.sent:
        assert not list(client.iter_errors(frame)), frame
    for frame in wire.received:
        errors = [e.message for e in server.iter_errors(frame)]
        assert not errors, (frame, errors)
    for event in wire.http["events"]:  # the same events, read over HTTP
        assert not list(server.iter_errors(event)), event
    kinds = {f.get("kind") for f in wire.received}
    assert {"turn_queued", "tool_call_started", "tool_call_finished", "proposal_created"} <= kinds
    assert {f["type"] for f in wire.received} >= {"event", "ack", "pong", "error"}
    # A frame that breaks the contract fails: the check is not vacuous.
    finished = next(f for f in wire.received if f.get("kind") == "turn_finished")
    assert not server.is_valid({**finished, "data": {**finished["data"], "status": "done"}})
    assert not server.is_valid({**finished, "ts": "2026-11-23T20:27:05+00:00"})


def test_every_timestamp_of_a_real_turn_has_one_format(wire: Wire) -> None:
    found = list(moments(wire.received, "ws")) + list(moments(wire.http, "http"))
    wanted = {"http.approve.decided_at", "http.proposal.created_at"}
    assert wanted <= {where for where, _ in found}, found
    events = [f for f in wire.received if f["type"] == "event"]
    assert sum(where.endswith(".ts") for where, _ in found) >= len(events)
    assert any(where.endswith("last_activity_at") for where, _ in found)
    assert any(
        where.startswith("http.conversation") and "created_at" in where for where, _ in found
    )
    wrong = [(where, text) for where, text in found if not TIMESTAMP.match(text)]
    assert not wrong, f"not RFC 3339 UTC with milliseconds and Z: {wrong}"
