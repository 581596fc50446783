"""A client that stops reading is closed with 1013 and resumes by id; others never wait for it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
import redis

from signalbox.services.gateway.state import Gateway
from signalbox.shared.event_stream import EventStream
from tests.gateway.conftest import LiveGateway, connect, recv, request
from tests.gateway.rawws import RawWebSocket

pytestmark = pytest.mark.anyio

QUEUE_SIZE = 8
EVENT_TEXT = "x" * (32 * 1024)  # big events fill the kernel's socket buffers in few appends
BATCH = 4  # under QUEUE_SIZE: the good client always has room
MAX_EVENTS = 2_000  # ~64 MB: far beyond any socket buffer; reaching it means no 1013 came
TAIL = 5  # events appended after the slow client was closed


def closes_1013(gateway: LiveGateway) -> float:
    state: Gateway = gateway.app.state.gateway
    value = state.metrics.registry.get_sample_value(
        "signalbox_gateway_ws_closes_total", {"code": "1013"}
    )
    return value or 0.0


def stream_ids(client: redis.Redis, gateway: LiveGateway, conversation_id: str) -> list[str]:
    entries: Any = client.xrange(gateway.keys.events(conversation_id))
    return [eid.decode() for eid, _ in entries]


async def test_a_client_that_never_reads_is_closed_others_get_everything(
    start_gateway: Callable[..., LiveGateway],
    make_user: Callable[[], tuple[str, str]],
    conversation_of: Callable[[str], str],
    redis_client: redis.Redis,
) -> None:
    gateway = start_gateway(client_queue_size=QUEUE_SIZE)
    user_id, token = make_user()
    conversation_id = conversation_of(user_id)
    stream = EventStream(redis_client, gateway.keys)

    slow = RawWebSocket("127.0.0.1", gateway.port, token)
    slow.send_json({"type": "subscribe", "conversation_id": conversation_id, "req": "s"})
    # From here on the slow client reads nothing until the gateway has given up on it.

    good_ids: list[str] = []
    async with await connect(gateway, token) as good:
        ack = await request(good, {"type": "subscribe", "conversation_id": conversation_id})
        assert ack["type"] == "ack"

        async def take(n: int) -> None:
            while len(good_ids) < n:
                frame = await recv(good)
                if frame["type"] == "event":
                    good_ids.append(frame["id"])

        # The good client reads everything as it comes; the producer never runs more than a
        # batch ahead of it (a batch fits its queue), so only the slow client falls behind.
        total = 0
        while closes_1013(gateway) < 1:
            assert total < MAX_EVENTS, f"no 1013 after {total} events"
            for _ in range(BATCH):
                stream.append(conversation_id, "text_delta", {"text": EVENT_TEXT}, "t")
            total += BATCH
            await take(total)
        for _ in range(TAIL):
            stream.append(conversation_id, "text_delta", {"text": "tail"}, "t")
        total += TAIL
        await take(total)

    stored = stream_ids(redis_client, gateway, conversation_id)
    assert len(stored) == total
    assert good_ids == stored

    # The slow client now reads what the kernel held for it, then the close frame.
    frames = await asyncio.to_thread(slow.read_until_closed)
    slow.close()
    assert frames[0] == {"type": "ack", "req": "s"}
    seen = [f["id"] for f in frames[1:] if f["type"] == "event"]
    assert slow.close_code == 1013
    assert 0 < len(seen) < total
    assert seen == stored[: len(seen)]  # a prefix: in order, nothing skipped, nothing twice

    # Resume by id: exactly the rest, once.
    async with await connect(gateway, token) as again:
        ack = await request(
            again, {"type": "subscribe", "conversation_id": conversation_id, "after": seen[-1]}
        )
        assert ack["type"] == "ack"
        rest: list[str] = []
        while len(rest) < total - len(seen):
            frame = await recv(again)
            assert frame["type"] == "event"
            rest.append(frame["id"])
        assert rest == stored[len(seen) :]
        # Nothing more is on its way: a ping's pong is the very next frame.
        await again.send(json.dumps({"type": "ping", "req": "last"}))
        assert await recv(again) == {"type": "pong", "req": "last"}


async def test_a_slow_client_does_not_delay_a_fast_one(
    start_gateway: Callable[..., LiveGateway],
    make_user: Callable[[], tuple[str, str]],
    conversation_of: Callable[[str], str],
    redis_client: redis.Redis,
) -> None:
    """While one socket is stuck (not yet over its queue), another's events arrive at once."""
    gateway = start_gateway(client_queue_size=10_000)
    user_id, token = make_user()
    conversation_id = conversation_of(user_id)
    stream = EventStream(redis_client, gateway.keys)
    slow = RawWebSocket("127.0.0.1", gateway.port, token)
    slow.send_json({"type": "subscribe", "conversation_id": conversation_id, "req": "s"})
    try:
        async with await connect(gateway, token) as good:
            await request(good, {"type": "subscribe", "conversation_id": conversation_id})
            # Enough to fill the slow socket's kernel buffers several times over.
            for _ in range(200):
                stream.append(conversation_id, "text_delta", {"text": EVENT_TEXT}, "t")
            for _ in range(200):
                frame = await recv(good)
                assert frame["type"] == "event"
            # The slow socket still reads nothing (and is not closed: its queue has room), so
            # the marker arriving at all shows the fast socket never waits for the slow one;
            # how soon it arrives is not asserted (a loaded machine delays everything).
            marker = stream.append(conversation_id, "text_delta", {"text": "now"}, "t")
            frame = await recv(good)
            assert frame["id"] == marker
            assert closes_1013(gateway) == 0
    finally:
        slow.close()
