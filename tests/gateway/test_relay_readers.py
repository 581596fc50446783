"""The relay's multiplexed readers: hundreds of conversations on one reader, reads of only
the streams whose bell rang, the sweep, killed connections, more streams than one reader
takes."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from sqlalchemy.orm import Session, sessionmaker
from websockets.asyncio.client import ClientConnection

from signalbox.services.gateway import stream_reader
from signalbox.services.gateway.relay import EventHead, RelayHub, Subscription
from signalbox.services.gateway.state import Gateway
from signalbox.shared.db import Conversation
from signalbox.shared.event_stream import AsyncEventStream, EventStream, encode
from signalbox.shared.ids import new_id
from signalbox.shared.redis_keys import RedisKeys
from tests.gateway.conftest import LiveGateway, connect, recv

pytestmark = pytest.mark.anyio

DEADLINE_S = 30.0  # generous: a lost event fails at the deadline, a busy CI only waits


# -- 300 conversations through one gateway process --------------------------------------

CONVERSATIONS = 300
SOCKETS = 30  # each subscribed to CONVERSATIONS / SOCKETS conversations
LIVE_ROUNDS = 4  # live events per conversation, appended round-robin over all of them


def _conversations(sessions: sessionmaker[Session], user_id: str, n: int) -> list[str]:
    ids = [new_id("conv") for _ in range(n)]
    with sessions() as session, session.begin():
        session.add_all(Conversation(id=c, user_id=user_id, workspace="default") for c in ids)
    return ids


async def _subscribe_all(ws: ClientConnection, group: list[str]) -> list[dict[str, Any]]:
    """Subscribe to every conversation of ``group`` at once; the frames up to the last reply."""
    for n, c in enumerate(group):
        await ws.send(json.dumps({"type": "subscribe", "conversation_id": c, "req": str(n)}))
    frames: list[dict[str, Any]] = []
    while sum("req" in f for f in frames) < len(group):
        frames.append(await recv(ws))
    return frames


async def _collect(
    ws: ClientConnection, frames: list[dict[str, Any]], expected: int
) -> list[dict[str, Any]]:
    """Frames until ``expected`` events; then a ping, to see nothing more was queued."""
    deadline = time.monotonic() + DEADLINE_S
    while sum(f["type"] == "event" for f in frames) < expected:
        frames.append(await recv(ws, max(0.1, deadline - time.monotonic())))
    await ws.send(json.dumps({"type": "ping", "req": "end"}))
    while (frame := await recv(ws))["type"] != "pong":
        frames.append(frame)
    return frames


async def test_one_gateway_follows_300_conversations_on_one_reader(
    start_gateway: Callable[..., LiveGateway],
    make_user: Callable[[], tuple[str, str]],
    db_sessions: sessionmaker[Session],
    redis_client: redis.Redis,
) -> None:
    gateway = start_gateway(rate_limit_per_minute=100_000)
    user_id, token = make_user()
    conversations = _conversations(db_sessions, user_id, CONVERSATIONS)
    stream = EventStream(redis_client, gateway.keys)
    for c in conversations:  # one stored event each: replayed, then live ones follow
        stream.append(c, "text_delta", {"text": "stored"}, "turn_x")
    per_socket = CONVERSATIONS // SOCKETS
    groups = [conversations[i * per_socket : (i + 1) * per_socket] for i in range(SOCKETS)]
    sockets = [await connect(gateway, token) for _ in range(SOCKETS)]
    try:
        joined = await asyncio.gather(
            *(_subscribe_all(ws, g) for ws, g in zip(sockets, groups, strict=True))
        )
        hub = _state(gateway).hub
        assert len(hub.followed) == CONVERSATIONS
        assert len(hub.readers) == 1  # two connections, not one per conversation

        def append_live() -> None:
            for n in range(LIVE_ROUNDS):
                for c in conversations:
                    stream.append(c, "text_delta", {"text": str(n)}, "turn_x")

        writer = threading.Thread(target=append_live)
        writer.start()
        expected = per_socket * (1 + LIVE_ROUNDS)
        received = await asyncio.gather(
            *(_collect(ws, f, expected) for ws, f in zip(sockets, joined, strict=True))
        )
        writer.join(DEADLINE_S)
    finally:
        await asyncio.gather(*(ws.close() for ws in sockets))

    for frames, group in zip(received, groups, strict=True):
        replies = [f for f in frames if f["type"] != "event"]
        assert [f["type"] for f in replies] == ["ack"] * per_socket, replies  # no `unavailable`
        for c in group:
            got = [f["id"] for f in frames if f.get("conversation_id") == c]
            assert got == [e.id for e in stream.read_after(c, None)], c  # once, in order


def _state(gateway: LiveGateway) -> Gateway:
    state: Gateway = gateway.app.state.gateway
    return state


# -- the hub alone, on a real Redis ------------------------------------------------------


class Sink:
    """What one subscription received, and a way to wait for it."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.changed = asyncio.Event()

    def deliver(self, event: EventHead, _text: str) -> None:
        self.ids.append(event.id)
        self.changed.set()

    async def wait_for(self, n: int, timeout_s: float = DEADLINE_S) -> list[str]:
        async with asyncio.timeout(timeout_s):
            while len(self.ids) < n:
                self.changed.clear()
                await self.changed.wait()
        return self.ids


class Hub:
    """A ``RelayHub`` on the test Redis, and helpers to follow and write conversations."""

    def __init__(
        self, redis_url: str, keys: RedisKeys, read_url: str | None = None, **options: Any
    ) -> None:
        self.keys = keys
        self.client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        self.client_name = f"{keys.prefix}relay-{uuid.uuid4().hex[:6]}"
        self.read_pool = aioredis.ConnectionPool.from_url(
            read_url or redis_url, decode_responses=True, protocol=2, client_name=self.client_name,
            socket_timeout=30,
        )  # fmt: skip
        self.stream = AsyncEventStream(self.client, keys)
        self.hub = RelayHub(self.stream, self.read_pool, buffer_limit=1000, **options)

    async def follow(self, conversation_id: str) -> tuple[Subscription, Sink]:
        sink = Sink()
        subscription, page = await self.hub.subscribe(
            conversation_id, None, sink.deliver, lambda: None
        )
        async for event, text in subscription.catch_up(page, self.stream):
            sink.deliver(event, text)
        return subscription, sink

    async def append(self, conversation_id: str, n: int) -> list[str]:
        return [
            await self.stream.append(conversation_id, "text_delta", {"text": str(i)}, "turn_x")
            for i in range(n)
        ]

    async def aclose(self) -> None:
        await self.hub.aclose()
        await self.client.aclose()
        await self.read_pool.disconnect()


@pytest.fixture
async def make_hub(redis_url: str, keys: RedisKeys) -> AsyncIterator[Callable[..., Hub]]:
    hubs: list[Hub] = []

    def make(**options: Any) -> Hub:
        hub = Hub(redis_url, RedisKeys(f"{keys.prefix}hub-{uuid.uuid4().hex[:6]}:"), **options)
        hubs.append(hub)
        return hub

    yield make
    for hub in hubs:
        await hub.aclose()


async def _until(condition: Callable[[], bool]) -> None:
    """Wait until ``condition()`` holds: a reader's own state, polled, with a deadline."""
    async with asyncio.timeout(DEADLINE_S):
        while True:
            if condition():
                return
            await asyncio.sleep(0.005)


async def _settled(hub: Hub) -> None:
    """Wait until the hub's readers have read everything their bells announced so far."""
    await _until(lambda: not any(r.pending for r in hub.hub.readers))


async def test_a_read_names_only_the_streams_whose_bell_rang(
    make_hub: Callable[..., Hub],
) -> None:
    hub = make_hub(sweep_s=120.0)  # no sweep within the test: every read is a bell's
    names = [f"c{i}" for i in range(100)]
    follows = {c: await hub.follow(c) for c in names}
    await _settled(hub)
    reader = hub.hub.readers[0]
    reads, named = reader.reads, reader.streams_read
    expected: list[str] = []
    for _ in range(5):  # one at a time: each bell's read is over before the next append
        expected += await hub.append("c7", 1)
        assert await follows["c7"][1].wait_for(len(expected)) == expected
    await _settled(hub)
    assert reader.reads > reads
    # Every read since named one stream; a read of every followed stream would name 100.
    assert reader.streams_read - named == reader.reads - reads


async def test_a_stream_is_read_when_its_bell_rings_not_at_the_sweep(
    make_hub: Callable[..., Hub],
) -> None:
    hub = make_hub(sweep_s=120.0)  # without the bells, B would wait up to 120 s
    _sub_a, _sink_a = await hub.follow("a")
    _sub_b, sink_b = await hub.follow("b")
    await _settled(hub)  # subscribed: only a bell can announce what comes next
    ids = await hub.append("b", 2)
    assert await sink_b.wait_for(2, timeout_s=DEADLINE_S) == ids


async def test_a_writer_that_does_not_ring_is_read_at_the_sweep(
    make_hub: Callable[..., Hub],
) -> None:
    hub = make_hub(sweep_s=0.2)
    _sub, sink = await hub.follow("quiet")
    await _settled(hub)  # subscribed and read: nothing but a sweep reads the stream again
    entry = encode("text_delta", {"text": "no bell"}, "turn_x")
    raw: Any = await hub.client.xadd(hub.keys.events("quiet"), entry)  # type: ignore[arg-type]
    assert await sink.wait_for(1) == [raw]


async def test_killed_connections_resume_where_they_stood(
    make_hub: Callable[..., Hub],
) -> None:
    hub = make_hub(sweep_s=120.0)  # what arrives after the kill comes from the bells
    follows = [await hub.follow(c) for c in ("a", "b", "c")]
    first = {c: await hub.append(c, 3) for c in ("a", "b", "c")}
    for (_sub, sink), c in zip(follows, ("a", "b", "c"), strict=True):
        assert await sink.wait_for(3) == first[c]
    killed = 0
    clients: Any = await hub.client.client_list()
    for client in clients:
        if client["name"] == hub.client_name:
            await hub.client.client_kill_filter(_id=client["id"])
            killed += 1
    assert killed == 2  # the bells' connection and the reads'
    # Appended while the reader has no connection: read once it is back, nothing twice.
    later = {c: await hub.append(c, 3) for c in ("a", "b", "c")}
    for (_sub, sink), c in zip(follows, ("a", "b", "c"), strict=True):
        assert await sink.wait_for(6) == first[c] + later[c]
    await _settled(hub)
    for (_sub, sink), c in zip(follows, ("a", "b", "c"), strict=True):
        assert sink.ids == first[c] + later[c]


async def test_more_streams_than_one_read_takes_go_to_another_reader(
    make_hub: Callable[..., Hub],
) -> None:
    hub = make_hub(streams_per_read=2, sweep_s=120.0)
    names = [f"c{i}" for i in range(5)]
    follows = {c: await hub.follow(c) for c in names}
    assert [len(r) for r in hub.hub.readers] == [2, 2, 1]
    appended = {c: await hub.append(c, 4) for c in names}
    for c in names:
        assert await follows[c][1].wait_for(4) == appended[c]
    # A conversation dropped and followed again starts from where its stream is now.
    hub.hub.unsubscribe(follows["c0"][0])
    assert "c0" not in hub.hub.followed
    _sub, sink = await hub.follow("c0")
    more = await hub.append("c0", 2)
    assert await sink.wait_for(6) == appended["c0"] + more
    await _settled(hub)  # a duplicate would have been handed on by now; none came
    assert len(sink.ids) == 6


async def test_a_bell_connection_gone_silent_is_opened_again(
    make_hub: Callable[..., Hub], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stream_reader, "BELL_SILENCE_S", 0.2)
    hub = make_hub(sweep_s=0.3)  # a PING every 0.3 s; silent 0.5 s: dead
    _sub, _sink = await hub.follow("a")
    await _settled(hub)
    reader = hub.hub.readers[0]
    opened = reader.bell_connections
    bells = reader._bells
    assert bells is not None

    async def silent(*_args: Any, **kwargs: Any) -> None:
        await asyncio.sleep(kwargs.get("timeout") or 0)
        return None  # what redis-py returns when nothing came within the timeout

    monkeypatch.setattr(bells, "read_response", silent)  # a half-open TCP connection
    await _until(lambda: reader.bell_connections > opened)
    await _settled(hub)
    assert reader._bells is not bells


async def test_bells_refused_by_acl_leave_the_connection_open_and_the_sweep_reads(
    make_hub: Callable[..., Hub], channelless_redis_url: str
) -> None:
    hub = make_hub(sweep_s=0.1, read_url=channelless_redis_url)
    _sub, sink = await hub.follow("a")
    reader = hub.hub.readers[0]
    await _until(lambda: reader.sweeps >= 10)  # a second: two reconnects, were it refused
    ids = await hub.append("a", 2)
    assert await sink.wait_for(2) == ids  # read at a sweep
    assert reader.bell_connections == 1
