"""``AsyncWebSocket(resend=True, on_state=...)``: a request whose reply a drop lost is sent
again on the next connection, a resent turn is followed from the last event delivered, every
connection change is heard, and a session that gives up says so instead of hanging.

The drops are real: a scripted WebSocket server cuts its TCP connection without a close
frame, and against the real stack a TCP forwarder in front of the gateway is stopped.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection, serve

from signalbox.client import (
    AsyncWebSocket,
    ConnectionLost,
    ConnectionState,
    StateChange,
    Unreachable,
)
from signalbox.shared.events import Event
from signalbox.stack import Stack
from tests.proposals.tcp_proxy import Proxy

DEADLINE_S = 20.0
TURN_TIMEOUT_S = 60.0


def _event(event_id: str, kind: str, data: dict[str, Any]) -> str:
    return json.dumps(
        {"type": "event", "conversation_id": "conv_1", "id": event_id, "turn_id": "turn_1",
         "ts": "2030-01-01T00:00:00.000Z", "kind": kind, "data": data}
    )  # fmt: skip


class LosesFirstReply:
    """Cuts the first connection as soon as a frame of ``kind`` arrives, unanswered; on the
    next connection answers it, and replays ``conv_1`` to a ``subscribe``."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.frames: list[list[dict[str, Any]]] = []

    async def handler(self, ws: ServerConnection) -> None:
        received: list[dict[str, Any]] = []
        self.frames.append(received)
        async for raw in ws:
            frame = json.loads(raw)
            received.append(frame)
            if frame["type"] == self.kind and len(self.frames) == 1:
                ws.transport.abort()  # the reply is lost with the connection
                return
            ack: dict[str, Any] = {"type": "ack", "req": frame["req"]}
            if frame["type"] == "user_turn":
                ack |= {"conversation_id": "conv_1", "turn_id": "turn_1"}
            if frame["type"] == "decide_proposal":
                ack |= {"proposal_id": frame["proposal_id"], "status": "applied"}
            await ws.send(json.dumps(ack))
            if frame["type"] == "subscribe" and frame.get("after") is None:
                await ws.send(_event("1-0", "turn_queued", {"text": "hi", "client_turn_id": "c"}))


def _run(server: LosesFirstReply, body: Callable[[str], Any]) -> Any:
    async def scenario() -> Any:
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            port = ws_server.sockets[0].getsockname()[1]
            return await asyncio.wait_for(body(f"http://127.0.0.1:{port}"), DEADLINE_S)

    return asyncio.run(scenario())


def test_a_request_whose_reply_the_drop_lost_is_sent_again_and_each_change_is_heard() -> None:
    server = LosesFirstReply("decide_proposal")
    states: list[StateChange] = []

    async def body(url: str) -> tuple[str, int]:
        async with AsyncWebSocket(url, "t", resend=True, on_state=states.append) as ws:
            ack = await ws.decide_proposal("prop_1", "approve")
            return ack.status, ws.resent

    status, resent = _run(server, body)
    assert (status, resent) == ("applied", 1)
    [first], second = server.frames[0], server.frames[1]
    assert first["type"] == "decide_proposal" and second[-1] == {**first, "req": second[-1]["req"]}
    assert [(s.state, s.connections) for s in states] == [
        (ConnectionState.CONNECTED, 1),
        (ConnectionState.DROPPED, 1),
        (ConnectionState.CONNECTED, 2),
        (ConnectionState.CLOSED, 2),
    ]
    assert states[1].detail == "the connection closed (1006)"  # no close frame: the network


def test_without_resend_the_lost_reply_is_connection_lost() -> None:
    async def body(url: str) -> None:
        async with AsyncWebSocket(url, "t") as ws:
            with pytest.raises(ConnectionLost):
                await ws.decide_proposal("prop_1", "approve")

    _run(LosesFirstReply("decide_proposal"), body)


def test_a_turn_resent_after_a_drop_is_followed_from_the_last_event_delivered() -> None:
    server = LosesFirstReply("user_turn")

    async def body(url: str) -> Event:
        async with AsyncWebSocket(url, "t", resend=True) as ws:
            ack = await ws.start_turn("hi", client_turn_id="c")
            assert ack.turn_id == "turn_1"
            return await ws.next_event(timeout_s=DEADLINE_S)

    first_event = _run(server, body)
    turns = [f for f in server.frames[1] if f["type"] == "user_turn"]
    assert [t["client_turn_id"] for t in turns] == ["c"]  # the same turn, once more
    # The gateway follows a repeated turn from "now"; the SDK asks for what it missed.
    subscribe = next(f for f in server.frames[1] if f["type"] == "subscribe")
    assert (subscribe["conversation_id"], subscribe.get("after")) == ("conv_1", None)
    assert (first_event.id, first_event.kind) == ("1-0", "turn_queued")


def test_a_session_that_gives_up_says_so_to_events_and_to_waiting_requests() -> None:
    server = LosesFirstReply("decide_proposal")
    states: list[StateChange] = []

    async def scenario() -> None:
        async with serve(server.handler, "127.0.0.1", 0) as ws_server:
            port = ws_server.sockets[0].getsockname()[1]
            ws = AsyncWebSocket(
                f"http://127.0.0.1:{port}", "t", 0.5, resend=True, on_state=states.append
            )
            await ws.connect()
        # The server is gone: the drop below can never be repaired.
        try:
            with pytest.raises(Unreachable):
                await asyncio.wait_for(ws.decide_proposal("prop_1", "approve"), DEADLINE_S)
            with pytest.raises(Unreachable):
                await ws.next_event(timeout_s=DEADLINE_S)
        finally:
            await ws.close()

    asyncio.run(scenario())
    seen = [s.state for s in states]
    assert ConnectionState.RETRYING in seen and ConnectionState.GAVE_UP in seen
    retry = next(s for s in states if s.state == ConnectionState.RETRYING)
    assert retry.retry_in_s is not None and "cannot reach the gateway" in (retry.detail or "")


# -- against the real stack ------------------------------------------------------------------


@pytest.fixture
def token(make_stack_user: Callable[[], tuple[str, str]], stack: Stack) -> str:
    user_id, token = make_stack_user()
    (stack.config.workspaces_root / user_id / "default").mkdir(parents=True, exist_ok=True)
    return token


@pytest.fixture
def proxy(stack: Stack) -> Iterator[Proxy]:
    forwarder = Proxy(("127.0.0.1", stack.gateway_port))
    forwarder.start()
    yield forwarder
    forwarder.stop()


def test_a_decision_made_while_the_gateway_is_unreachable_goes_through_once_it_is_back(
    stack: Stack, token: str, proxy: Proxy
) -> None:
    states: list[StateChange] = []

    async def scenario() -> str:
        url = f"http://127.0.0.1:{proxy.port}"
        async with AsyncWebSocket(url, token, resend=True, on_state=states.append) as ws:
            ack = await ws.start_turn("create hello.txt with Hello")
            proposal_id = None
            deadline = time.monotonic() + TURN_TIMEOUT_S
            while True:
                event = await ws.next_event(timeout_s=max(0.1, deadline - time.monotonic()))
                if event.kind == "proposal_created":
                    proposal_id = event.data["proposal_id"]
                if event.kind == "turn_finished" and event.turn_id == ack.turn_id:
                    break
            assert proposal_id is not None
            proxy.stop()  # the connection dies; the decision waits for the next one
            decided = asyncio.create_task(ws.decide_proposal(proposal_id, "approve"))
            await _until(lambda: ConnectionState.RETRYING in {s.state for s in states})
            assert not decided.done()
            proxy.start()
            return (await asyncio.wait_for(decided, DEADLINE_S)).status

    assert asyncio.run(scenario()) == "applied"
    assert [s.connections for s in states if s.state == ConnectionState.CONNECTED] == [1, 2]


async def _until(predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)  # polling a list the session's callback fills, with a deadline
