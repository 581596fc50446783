"""One real turn through all four services, as separate processes, driven as a program would:
through the Python SDK (``signalbox.client``) over a real WebSocket and HTTP."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from websockets.exceptions import InvalidStatus

from signalbox.client import Client, Conflict, WebSocket
from signalbox.shared.event_stream import EventStream, id_after
from signalbox.shared.events import Event
from signalbox.shared.redis_keys import RedisKeys
from signalbox.stack import Stack
from tests import http_calls
from tests.wsclient import WsClient

TURN_TIMEOUT_S = 60.0


@pytest.fixture
def user(make_stack_user: Callable[[], tuple[str, str]], stack: Stack) -> tuple[str, str]:
    """A user with a default workspace holding a couple of files."""
    user_id, token = make_stack_user()
    ws = stack.config.workspaces_root / user_id / "default"
    ws.mkdir(parents=True)
    (ws / "README.md").write_text("# demo\nTODO: write the docs\n")
    (ws / "app.py").write_text("print('hello')  # FIXME greet by name\n")
    return user_id, token


@pytest.fixture
def sdk(stack: Stack, user: tuple[str, str]) -> Iterator[tuple[WebSocket, Client]]:
    """The Python SDK's WebSocket session and HTTP client, as a program would use them."""
    with (
        WebSocket(stack.gateway_url, user[1]) as socket,
        Client(stack.gateway_url, user[1]) as http,
    ):
        yield socket, http


@pytest.fixture
def client(stack: Stack, user: tuple[str, str]) -> Iterator[WsClient]:
    """A raw socket, for what the SDK never sends (malformed frames)."""
    c = WsClient(stack.gateway_url, user[1])
    yield c
    c.close()


def workspace(stack: Stack, user_id: str) -> Path:
    return stack.config.workspaces_root / user_id / "default"


def turn_events(socket: WebSocket, turn_id: str, seen: list[Event] | None = None) -> list[Event]:
    """Events of ``turn_id`` up to its ``turn_finished``, within the deadline."""
    seen = [] if seen is None else seen
    deadline = time.monotonic() + TURN_TIMEOUT_S
    while not (seen and seen[-1].kind == "turn_finished" and seen[-1].turn_id == turn_id):
        seen.append(socket.next_event(timeout_s=max(0.1, deadline - time.monotonic())))
    return [e for e in seen if e.turn_id == turn_id]


def test_turn_runs_tools_in_parallel_and_proposes_a_file(
    stack: Stack, user: tuple[str, str], sdk: tuple[WebSocket, Client]
) -> None:
    socket, http = sdk
    ack = socket.start_turn("look around, then create hello.txt")
    events = turn_events(socket, ack.turn_id)
    seq = [e.kind for e in events]

    assert seq[0] == "turn_queued"
    assert seq[1] == "turn_started"
    assert "text_delta" in seq
    assert seq[-1] == "turn_finished"
    assert events[-1].data["status"] == "completed", events[-1]
    ids = [e.id for e in events]
    assert all(id_after(b, a) for a, b in itertools.pairwise(ids)), "ids must increase"

    # The first tool step: at least two calls announced before any of them finished.
    started = [i for i, k in enumerate(seq) if k == "tool_call_started"]
    finished = [i for i, k in enumerate(seq) if k == "tool_call_finished"]
    assert len(started) >= 3 and len(finished) == len(started)
    assert started[1] < finished[0], f"the first two calls did not overlap: {seq}"
    for i in finished:
        assert events[i].data["status"] == "ok", events[i]
    tools = {events[i].data["tool"] for i in started}
    assert {"list_dir", "search_files", "write_file"} <= tools

    created = [e for e in events if e.kind == "proposal_created"]
    assert len(created) == 1
    assert created[0].data["files"] == [{"path": "hello.txt", "operation": "create"}]
    assert "[offline demo model" in "".join(
        e.data["text"] for e in events if e.kind == "text_delta"
    )

    # Nothing is written before a human approves.
    target = workspace(stack, user[0]) / "hello.txt"
    assert not target.exists()

    proposal_id = created[0].data["proposal_id"]
    assert http.approve(proposal_id).status == "applied"
    assert target.exists()
    deadline = time.monotonic() + TURN_TIMEOUT_S
    while True:
        event = socket.next_event(timeout_s=max(0.1, deadline - time.monotonic()))
        if event.kind == "proposal_resolved" and event.data["proposal_id"] == proposal_id:
            break
    assert event.data["status"] == "applied"

    # Approving again is harmless: same answer, no second write.
    mtime = target.stat().st_mtime_ns
    assert http.approve(proposal_id).status == "applied"
    assert target.stat().st_mtime_ns == mtime


def test_stale_proposal_answers_409_and_writes_nothing(
    stack: Stack, user: tuple[str, str], sdk: tuple[WebSocket, Client]
) -> None:
    socket, http = sdk
    ack = socket.start_turn("create notes.md")
    events = turn_events(socket, ack.turn_id)
    created = [e for e in events if e.kind == "proposal_created"]
    assert len(created) == 1
    target = workspace(stack, user[0]) / "notes.md"
    target.write_text("written by a human meanwhile\n")

    with pytest.raises(Conflict):
        http.approve(created[0].data["proposal_id"])
    assert target.read_text() == "written by a human meanwhile\n"


def test_reconnect_with_last_event_id_gets_every_later_event_once(
    stack: Stack, user: tuple[str, str], redis_url: str
) -> None:
    with WebSocket(stack.gateway_url, user[1]) as first:
        ack = first.start_turn("look around")
        seen: list[Event] = []
        deadline = time.monotonic() + TURN_TIMEOUT_S
        while not any(e.kind == "turn_started" for e in seen):
            seen.append(first.next_event(timeout_s=max(0.1, deadline - time.monotonic())))
    # The first session is gone mid-turn; a new one resumes after the last event it saw.

    with WebSocket(stack.gateway_url, user[1]) as second:
        second.subscribe(ack.conversation_id, after=seen[-1].id)
        later = turn_events(second, ack.turn_id)

    received = seen + later
    ids = [e.id for e in received]
    assert len(ids) == len(set(ids)), "an event was delivered twice"
    client = redis.Redis.from_url(redis_url)
    stored = EventStream(client, RedisKeys(stack.config.redis_prefix)).read_after(
        ack.conversation_id, None
    )
    client.close()
    assert ids == [e.id for e in stored], "the reconnected client missed or reordered events"


def test_bad_frames_get_errors_and_the_socket_stays_open(client: WsClient) -> None:
    client.conn.send("this is not json")
    err = client.wait_for(lambda f: f["type"] == "error")
    assert err["code"] == "bad_frame"

    reply = client.request({"type": "launch_rockets"})
    assert reply["type"] == "error" and reply["code"] == "unknown_type"

    reply = client.request({"type": "ping"})
    assert reply["type"] == "pong"


def test_wrong_token_is_refused_at_the_handshake(stack: Stack) -> None:
    with pytest.raises(InvalidStatus) as exc:
        WsClient(stack.gateway_url, "sbt_not-a-real-token")
    assert exc.value.response.status_code == 403


def test_health_and_readiness(stack: Stack) -> None:
    for base in (stack.gateway_url, stack.proposals_url):
        assert http_calls.get(f"{base}/healthz").status_code == 200
        ready = http_calls.get(f"{base}/readyz")
        assert ready.status_code == 200, json.dumps(ready.json())
