"""``signalbox.client`` against every service as a real process (the offline demo model):
turns, streams that resume after a drop with nothing lost or repeated, proposals, errors.

Drops are real: the SDK reaches the gateway through a TCP forwarder the test cuts, while a
second client (straight to the gateway) runs a turn whose events the first one missed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import pytest

from signalbox.client import (
    AsyncClient,
    AsyncWebSocket,
    BadRequest,
    Client,
    Conflict,
    NotFound,
    Unauthorized,
    WebSocket,
)
from signalbox.shared.events import Event
from signalbox.stack import Stack
from tests.proposals.tcp_proxy import Proxy

TURN_TIMEOUT_S = 60.0


@pytest.fixture
def token(make_stack_user: Callable[[], tuple[str, str]], stack: Stack) -> str:
    return make_stack_user()[1]


@pytest.fixture
def proxy(stack: Stack) -> Iterator[Proxy]:
    forwarder = Proxy(("127.0.0.1", stack.gateway_port))
    forwarder.start()
    yield forwarder
    forwarder.stop()


def _until_finished(events: Iterator[Event], turn_id: str) -> list[Event]:
    """Events from ``events`` up to ``turn_id``'s ``turn_finished`` (within the deadline)."""
    seen: list[Event] = []
    deadline = time.monotonic() + TURN_TIMEOUT_S
    for event in events:
        seen.append(event)
        if event.kind == "turn_finished" and event.turn_id == turn_id:
            return seen
        assert time.monotonic() < deadline, f"turn {turn_id} did not finish"
    raise AssertionError("the stream ended")


def _run_turn(client: Client, conversation_id: str, text: str) -> str:
    """Start a turn and wait (on its own stream) until it finished; its id."""
    stored = client.events(conversation_id)
    turn = client.start_turn(conversation_id, text)
    after = stored[-1].id if stored else None
    _until_finished(client.stream(conversation_id, after=after), turn.turn_id)
    return turn.turn_id


def test_a_turn_its_proposal_and_approval_through_the_sdk(stack: Stack, token: str) -> None:
    with Client(stack.gateway_url, token) as sb:
        conversation_id = sb.create_conversation().conversation_id
        turn = sb.start_turn(conversation_id, "create hello.txt with Hello", client_turn_id="t1")
        assert turn.created and turn.conversation_id == conversation_id
        assert sb.start_turn(
            conversation_id, "create hello.txt with Hello", "t1"
        ) == turn.model_copy(update={"created": False})
        events = _until_finished(sb.stream(conversation_id), turn.turn_id)
        assert [e.id for e in events] == [e.id for e in sb.events(conversation_id)]
        [created] = [e for e in events if e.kind == "proposal_created"]
        proposal_id = created.data["proposal_id"]

        assert [p.proposal_id for p in sb.pending_proposals()] == [proposal_id]
        assert sb.proposal(proposal_id).files[0].path == "hello.txt"
        assert sb.approve(proposal_id).status == "applied"
        assert sb.pending_proposals() == []
        with pytest.raises(Conflict):
            sb.reject(proposal_id)
        with pytest.raises(NotFound):
            sb.proposal("prop_nope")
        with pytest.raises(NotFound):
            sb.answer("call_nope", "hi")
        with pytest.raises(BadRequest, match="output"):  # refused before it is sent
            sb.tool_result(turn.turn_id, "tok", "out\x00put")
        with pytest.raises(NotFound):  # what the gateway says of a call that does not wait
            sb.tool_result(turn.turn_id, "tok", "output")
    with Client(stack.gateway_url, "sbt_wrong") as stranger, pytest.raises(Unauthorized):
        stranger.me()


def test_the_sse_stream_resumes_after_a_drop_with_nothing_lost_or_repeated(
    stack: Stack, token: str, proxy: Proxy
) -> None:
    with (
        Client(stack.gateway_url, token) as direct,
        Client(f"http://127.0.0.1:{proxy.port}", token) as dropped,
    ):
        conversation_id = direct.create_conversation().conversation_id
        first = direct.start_turn(conversation_id, "look around")
        stream = dropped.stream(conversation_id)
        seen = _until_finished(stream, first.turn_id)

        proxy.stop()  # the stream's connection dies; a whole turn runs meanwhile
        second = _run_turn(direct, conversation_id, "look around again")
        proxy.start()

        seen += _until_finished(stream, second)
        assert proxy.accepted >= 2  # it did reconnect
        stored = direct.events(conversation_id)
        assert [e.id for e in seen] == [e.id for e in stored]
        assert len({e.id for e in seen}) == len(seen)


def test_the_websocket_resumes_after_a_drop_with_nothing_lost_or_repeated(
    stack: Stack, token: str, proxy: Proxy
) -> None:
    async def scenario() -> tuple[list[Event], list[Event], int]:
        with Client(stack.gateway_url, token) as direct:
            async with AsyncWebSocket(f"http://127.0.0.1:{proxy.port}", token) as ws:
                ack = await ws.start_turn("look around")
                conversation_id = ack.conversation_id
                seen = await _ws_until_finished(ws, ack.turn_id)

                proxy.stop()
                second = await asyncio.to_thread(
                    _run_turn, direct, conversation_id, "look around again"
                )
                proxy.start()

                seen += await _ws_until_finished(ws, second)
                return seen, direct.events(conversation_id), ws.connections

    seen, stored, connections = asyncio.run(scenario())
    assert connections == 2
    assert [e.id for e in seen] == [e.id for e in stored]


async def _ws_until_finished(ws: AsyncWebSocket, turn_id: str) -> list[Event]:
    seen: list[Event] = []
    deadline = time.monotonic() + TURN_TIMEOUT_S
    while True:
        event = await ws.next_event(timeout_s=max(0.1, deadline - time.monotonic()))
        seen.append(event)
        if event.kind == "turn_finished" and event.turn_id == turn_id:
            return seen


def test_the_blocking_websocket_decides_a_proposal(stack: Stack, token: str) -> None:
    with WebSocket(stack.gateway_url, token) as ws:
        ack = ws.start_turn("create hello.txt with Hello")
        proposal_id = None
        for event in ws.events():
            if event.kind == "proposal_created":
                proposal_id = event.data["proposal_id"]
            if event.kind == "turn_finished":
                break
        assert proposal_id is not None and ack.turn_id
        decided = ws.decide_proposal(proposal_id, "reject", reason="not now")
        assert decided.status == "rejected"
        with pytest.raises(Conflict):
            ws.decide_proposal(proposal_id, "approve")


def test_the_async_sdk_binds_a_conversation_to_an_agent_that_thinks(
    stack: Stack, token: str
) -> None:
    asyncio.run(_agent_that_thinks(stack, token))


async def _agent_that_thinks(stack: Stack, token: str) -> None:
    # An agent of the user's own, in chat mode with a thinking budget: the offline demo model
    # then thinks aloud and answers in text alone, offering no tool.
    config = {"mode": "chat", "thinking_budget_tokens": 2048}
    async with AsyncClient(stack.gateway_url, token) as sb:
        made = await sb.create_agent("thinker", config)
        assert (made.name, made.version, made.scope) == ("thinker", 1, "user")
        assert [a.name for a in await sb.agents() if a.name == "thinker"] == ["thinker"]
        conversation = await sb.create_conversation(agent="thinker")
        turn = await sb.start_turn(conversation.conversation_id, "create hello.txt")
        events: list[Event] = []
        async with asyncio.timeout(TURN_TIMEOUT_S):
            async for event in sb.stream(conversation.conversation_id):
                events.append(event)
                if event.kind == "turn_finished" and event.turn_id == turn.turn_id:
                    break
        kinds = [e.kind for e in events]
        assert "thinking_delta" in kinds and "text_delta" in kinds, kinds
        assert "tool_call_started" not in kinds and "proposal_created" not in kinds, kinds
        assert events[-1].data["status"] == "completed"
        detail = await sb.conversation(conversation.conversation_id)
        assert (detail.agent, detail.agent_version) == ("thinker", 1)
        with pytest.raises(Conflict):  # bound for good: another agent is refused
            await sb.start_turn(conversation.conversation_id, "hi", agent="default-nope")
        with pytest.raises(NotFound):
            await sb.create_conversation(agent="no-such-agent")
