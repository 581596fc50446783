"""More frames in flight than a Redis pool has connections: they wait, none is refused."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest
import redis

from signalbox.services.gateway.state import POOL_SIZE
from tests.gateway.conftest import LiveGateway, connect, recv

pytestmark = pytest.mark.anyio

SOCKETS = POOL_SIZE + 20  # one frame in flight per socket: 20 more than the pool holds
PAUSE_MS = 300  # Redis holds every write this long, so every frame's command is in flight


async def test_a_burst_beyond_the_pool_waits_instead_of_answering_unavailable(
    start_gateway: Callable[..., LiveGateway],
    make_user: Callable[[], tuple[str, str]],
    redis_client: redis.Redis,
) -> None:
    gateway = start_gateway(rate_limit_per_minute=100_000)
    _user_id, token = make_user()
    sockets = await asyncio.gather(*(connect(gateway, token) for _ in range(SOCKETS)))
    try:
        # Every frame starts with the rate limit's INCR, a write: paused, each holds a
        # connection of the request pool until Redis lets writes through again.
        redis_client.client_pause(PAUSE_MS, all=False)  # WRITE: reads (PINGs) still pass
        await asyncio.gather(*(ws.send(json.dumps({"type": "ping", "req": "p"})) for ws in sockets))
        replies = await asyncio.gather(*(recv(ws) for ws in sockets))
    finally:
        redis_client.client_unpause()
        await asyncio.gather(*(ws.close() for ws in sockets))
    assert [r for r in replies if r["type"] != "pong"] == []
