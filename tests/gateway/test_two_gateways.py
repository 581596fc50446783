"""Two gateway processes on one Redis and SQL: clients on each see every event once, in order,
however often they drop and resume (at seeded random points, checked against the stream)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import websockets

from signalbox.processes import Child, ServiceCommands, child_env, http_ok, stop_together
from signalbox.redis_server import free_port
from signalbox.shared.event_stream import EventStream
from signalbox.shared.redis_keys import RedisKeys
from tests.gateway.conftest import bearer, recv

pytestmark = pytest.mark.anyio

EVENTS = 300
SEEDS = (7, 11, 2024)


class Gateways:
    """Two real ``uvicorn`` gateway processes sharing a deployment prefix."""

    def __init__(self, children: list[Child], ports: list[int], keys: RedisKeys) -> None:
        self.children = children
        self.ports = ports
        self.keys = keys

    def ws_url(self, i: int) -> str:
        return f"ws://127.0.0.1:{self.ports[i]}/ws"


@pytest.fixture(scope="module")
def two_gateways(
    tmp_path_factory: pytest.TempPathFactory,
    redis_url: str,
    redis_prefix: str,
    database_url: str,
    internal_token: str,
) -> Iterator[Gateways]:
    var = tmp_path_factory.mktemp("two-gateways")
    prefix = f"{redis_prefix}gw2-{uuid.uuid4().hex[:6]}:"
    env = child_env(
        {k: v for k, v in os.environ.items() if not k.startswith("SIGNALBOX_")},
        {
            "SIGNALBOX_REDIS_URL": redis_url,
            "SIGNALBOX_REDIS_PREFIX": prefix,
            "SIGNALBOX_DATABASE_URL": database_url,
            "SIGNALBOX_INTERNAL_TOKEN": internal_token,
            "SIGNALBOX_WORKSPACES_ROOT": str(var / "workspaces"),
            "SIGNALBOX_LOG_LEVEL": "WARNING",
        },
    )
    commands = ServiceCommands()
    ports = [free_port(), free_port()]
    children = [
        Child(f"gateway{i}", commands.gateway(port), var / f"gateway{i}.log", env)
        for i, port in enumerate(ports)
    ]
    try:
        for child in children:
            child.start()
        for child, port in zip(children, ports, strict=True):
            child.wait_ready(http_ok(f"http://127.0.0.1:{port}/healthz"))
        yield Gateways(children, ports, RedisKeys(prefix))
    finally:
        stop_together(children)


async def follow(
    url: str,
    token: str,
    conversation_id: str,
    rng: random.Random,
    total: asyncio.Future[int],
) -> tuple[list[str], int]:
    """Collect the conversation's events across random drops; returns (ids, reconnects)."""
    seen: list[str] = []
    reconnects = -1
    while not (total.done() and len(seen) >= total.result()):
        reconnects += 1
        last = seen[-1] if seen else None
        ws = await websockets.connect(url, additional_headers=bearer(token))
        try:
            subscribe = {"type": "subscribe", "conversation_id": conversation_id, "after": last}
            await ws.send(json.dumps({**subscribe, "req": "s"}))
            if rng.random() < 0.15:
                continue  # drop before even the ack arrives
            budget = rng.randint(1, 60)  # events to take before this connection drops
            while budget > 0 and not (total.done() and len(seen) >= total.result()):
                try:
                    frame = await recv(ws, timeout_s=0.5)
                except TimeoutError:
                    continue  # the producer is between events; check whether it is done
                if frame["type"] == "event":
                    assert frame["conversation_id"] == conversation_id
                    seen.append(frame["id"])
                    budget -= 1
                else:
                    assert frame == {"type": "ack", "req": "s"}
        finally:
            # A dropped connection, not a polite close: no closing handshake.
            ws.transport.abort()
            await ws.wait_closed()
    return seen, reconnects


@pytest.mark.parametrize("seed", SEEDS)
async def test_clients_on_two_gateways_see_every_event_once_in_order(
    seed: int,
    two_gateways: Gateways,
    make_user: Callable[[], tuple[str, str]],
    conversation_of: Callable[[str], str],
    redis_client: redis.Redis,
) -> None:
    user_id, token = make_user()
    conversation_id = conversation_of(user_id)
    stream = EventStream(redis_client, two_gateways.keys)
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    total: asyncio.Future[int] = loop.create_future()

    def produce() -> int:
        # A turn-like mix, appended while the clients come and go.
        producer_rng = random.Random(seed * 31)
        for i in range(EVENTS):
            if producer_rng.random() < 0.1:
                data: dict[str, Any] = {"call_id": f"c{i}", "tool": "list_dir", "input": {}}
                stream.append(conversation_id, "tool_call_started", {**data, "timeout_s": 5}, "t")
            else:
                stream.append(conversation_id, "text_delta", {"text": f"{i} "}, "t")
            if i % 10 == 9:
                time.sleep(0.005)  # a model's pace: some events arrive live, some by replay
        return EVENTS

    async def run_producer() -> None:
        total.set_result(await asyncio.to_thread(produce))

    clients = [
        follow(
            two_gateways.ws_url(i % 2), token, conversation_id, random.Random(rng.random()), total
        )
        for i in range(2)
    ]
    producer = asyncio.create_task(run_producer())
    results = await asyncio.wait_for(asyncio.gather(*clients), timeout=60.0)
    await producer
    entries: Any = redis_client.xrange(two_gateways.keys.events(conversation_id))
    stored = [eid.decode() for eid, _ in entries]
    assert len(stored) == EVENTS
    for seen, reconnects in results:
        assert seen == stored
        assert reconnects >= 3, "the seed should make each client drop a few times"


async def test_a_socket_on_one_gateway_sees_a_turn_sent_through_the_other(
    two_gateways: Gateways,
    make_user: Callable[[], tuple[str, str]],
) -> None:
    """A user's second socket, on another gateway, follows the conversation it subscribes to."""
    _, token = make_user()
    async with (
        websockets.connect(two_gateways.ws_url(0), additional_headers=bearer(token)) as first,
        websockets.connect(two_gateways.ws_url(1), additional_headers=bearer(token)) as second,
    ):
        await first.send(json.dumps({"type": "user_turn", "text": "hello", "req": "t"}))
        ack: dict[str, Any] = {}
        early: list[dict[str, Any]] = []
        while not ack:
            frame = await recv(first)
            if frame.get("req") == "t":
                ack = frame
            else:
                early.append(frame)
        conversation_id = ack["conversation_id"]
        await second.send(
            json.dumps({"type": "subscribe", "conversation_id": conversation_id, "req": "s"})
        )
        assert await recv(second) == {"type": "ack", "req": "s"}
        kinds = [(await recv(second))["kind"] for _ in range(2)]
        assert kinds == ["conversation_created", "turn_queued"]
        # A second turn from the second gateway reaches the socket on the first.
        await second.send(
            json.dumps({"type": "user_turn", "conversation_id": conversation_id, "text": "again"})
        )
        while True:
            frame = await recv(first)
            if frame.get("type") == "event" and frame["data"].get("text") == "again":
                break
