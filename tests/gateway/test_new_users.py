"""New users arriving at once: each first turn makes its default workspace and conversation.

The attack of issue 12 (finding 5): many users on fresh accounts send their first message
at the same moment, some from two sockets at once (two tabs, or a client resending on a
new connection); every send must get ``ack`` and its ``turn_queued``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection

from tests.gateway.conftest import LiveGateway, connect

pytestmark = pytest.mark.anyio

Users = Callable[[], tuple[str, str]]
REPLY_TIMEOUT_S = 60.0  # 200 first turns at once on 2 shared cores


async def _first_turn(
    ws: ClientConnection, start: asyncio.Event, frame: dict[str, Any], wait_queued: bool = True
) -> dict[str, Any]:
    """Send ``frame`` when ``start`` fires; its reply, once ``turn_queued`` of it arrived too."""
    await start.wait()
    await ws.send(json.dumps({**frame, "req": "first"}))
    reply: dict[str, Any] | None = None
    queued: set[str] = set()
    while reply is None or (
        wait_queued and reply["type"] == "ack" and reply["turn_id"] not in queued
    ):
        got = json.loads(await asyncio.wait_for(ws.recv(), REPLY_TIMEOUT_S))
        if got.get("req") == "first":
            reply = got
        elif got.get("kind") == "turn_queued":
            queued.add(got["turn_id"])
    return reply


async def _sockets(gateway: LiveGateway, tokens: list[str]) -> list[ClientConnection]:
    return list(
        await asyncio.gather(*(connect(gateway, t, open_timeout=REPLY_TIMEOUT_S) for t in tokens))
    )


@pytest.mark.parametrize("users", [20, 200])
async def test_new_users_at_once_all_get_their_first_turn(
    gateway: LiveGateway, make_user: Users, users: int
) -> None:
    sockets = await _sockets(gateway, [make_user()[1] for _ in range(users)])
    start = asyncio.Event()
    frame = {"type": "user_turn", "conversation_id": None, "text": "hello"}
    try:
        sends = [asyncio.create_task(_first_turn(ws, start, frame)) for ws in sockets]
        began = time.monotonic()
        start.set()
        replies = await asyncio.gather(*sends)
        print(f"\n{users} new users, first turns at once: {time.monotonic() - began:.2f} s")
    finally:
        await asyncio.gather(*(ws.close() for ws in sockets))
    assert [r for r in replies if r["type"] != "ack"] == []
    assert len({r["conversation_id"] for r in replies}) == users


async def test_a_new_users_first_turns_from_several_sockets_at_once(
    gateway: LiveGateway, make_user: Users
) -> None:
    """Each user's sockets race to create the same default workspace; every send succeeds."""
    tokens = [make_user()[1] for _ in range(20)]
    sockets = await _sockets(gateway, [t for t in tokens for _ in range(3)])
    start = asyncio.Event()
    frame = {"type": "user_turn", "conversation_id": None, "text": "hello"}
    try:
        sends = [asyncio.create_task(_first_turn(ws, start, frame)) for ws in sockets]
        start.set()
        replies = await asyncio.gather(*sends)
    finally:
        await asyncio.gather(*(ws.close() for ws in sockets))
    assert [r for r in replies if r["type"] != "ack"] == []
    assert len({r["conversation_id"] for r in replies}) == 60  # three messages each


async def test_a_first_turn_resent_on_several_sockets_at_once_makes_one_conversation(
    gateway: LiveGateway, make_user: Users
) -> None:
    """The same ``client_turn_id`` sent three times at once: one conversation, one turn."""
    tokens = [make_user()[1] for _ in range(20)]
    sockets = await _sockets(gateway, [t for t in tokens for _ in range(3)])
    start = asyncio.Event()
    try:
        sends = [
            asyncio.create_task(
                _first_turn(
                    ws,
                    start,
                    {
                        "type": "user_turn",
                        "conversation_id": None,
                        "text": "hello",
                        "client_turn_id": f"first-{i // 3}",
                    },
                    wait_queued=False,
                )
            )
            for i, ws in enumerate(sockets)
        ]
        start.set()
        replies = await asyncio.gather(*sends)
    finally:
        await asyncio.gather(*(ws.close() for ws in sockets))
    assert [r for r in replies if r["type"] != "ack"] == []
    for user in range(20):
        mine = replies[3 * user : 3 * user + 3]
        assert len({(r["conversation_id"], r["turn_id"]) for r in mine}) == 1, mine
