"""Per-user rate limits, per class of action, held across two gateway processes on one Redis.

Each test has users of its own, so the counters (keyed by user) of one test never touch
another's. The limits are tiny and per minute: every refusal here is well inside a window.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import websockets
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from signalbox.processes import Child, ServiceCommands, child_env, http_ok, stop_together
from signalbox.redis_server import free_port
from signalbox.shared.db import Turn
from tests import http_calls
from tests.gateway.conftest import bearer, request

pytestmark = pytest.mark.anyio

LIMITS = {
    "SIGNALBOX_RATE_LIMIT_TURNS": "4/minute",
    "SIGNALBOX_RATE_LIMIT_DECISIONS": "2/minute",
    "SIGNALBOX_RATE_LIMIT_TICKETS": "2/minute",
    "SIGNALBOX_RATE_LIMIT_UPLOADS": "1/minute",
    "SIGNALBOX_RATE_LIMIT_WRITES": "3/minute",
}


class TwoGateways:
    """Two real gateway processes on one Redis prefix and one database."""

    def __init__(self, ports: list[int]) -> None:
        self.urls = [f"http://127.0.0.1:{p}" for p in ports]
        self.ws_urls = [f"ws://127.0.0.1:{p}/ws" for p in ports]


@pytest.fixture(scope="module")
def gateways(
    tmp_path_factory: pytest.TempPathFactory,
    redis_url: str,
    redis_prefix: str,
    database_url: str,
    internal_token: str,
) -> Iterator[TwoGateways]:
    var = tmp_path_factory.mktemp("rate-limits")
    env = child_env(
        {k: v for k, v in os.environ.items() if not k.startswith("SIGNALBOX_")},
        {
            "SIGNALBOX_REDIS_URL": redis_url,
            "SIGNALBOX_REDIS_PREFIX": f"{redis_prefix}rl-{uuid.uuid4().hex[:6]}:",
            "SIGNALBOX_DATABASE_URL": database_url,
            "SIGNALBOX_INTERNAL_TOKEN": internal_token,
            "SIGNALBOX_WORKSPACES_ROOT": str(var / "workspaces"),
            "SIGNALBOX_LOG_LEVEL": "WARNING",
            **LIMITS,
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
        yield TwoGateways(ports)
    finally:
        stop_together(children)


def _refused(response: httpx.Response) -> None:
    assert response.status_code == 429, response.text
    assert response.json()["code"] == "rate_limited"
    retry_after = int(response.headers["Retry-After"])
    assert 1 <= retry_after <= 60


def _turns_in(sessions: sessionmaker[Session], conversation_id: str) -> int:
    with sessions() as s:
        return int(
            s.scalar(
                select(func.count())
                .select_from(Turn)
                .where(Turn.conversation_id == conversation_id)
            )
            or 0
        )


async def test_turns_over_http_and_websocket_share_one_limit_across_both_gateways(
    gateways: TwoGateways,
    make_user: Callable[[], tuple[str, str]],
    conversation_of: Callable[[str], str],
    db_sessions: sessionmaker[Session],
) -> None:
    user_id, token = make_user()
    conversation_id = conversation_of(user_id)
    turns_url = f"/api/conversations/{conversation_id}/turns"
    first, second = (
        http_calls.AsyncClient(base_url=u, headers=bearer(token)) for u in gateways.urls
    )
    async with (
        first,
        second,
        websockets.connect(gateways.ws_urls[1], additional_headers=bearer(token)) as ws,
    ):
        for client in (first, second):
            response = await client.post(turns_url, json={"text": "go"})
            assert response.status_code == 202, response.text
        for _ in range(2):
            frame = {"type": "user_turn", "conversation_id": conversation_id, "text": "go"}
            reply = await request(ws, frame)
            assert reply["type"] == "ack", reply

        _refused(await first.post(turns_url, json={"text": "one too many"}))
        _refused(await second.post(turns_url, json={"text": "one too many"}))
        frame = {"type": "user_turn", "conversation_id": conversation_id, "text": "too many"}
        reply = await request(ws, frame)
        assert (reply["type"], reply["code"]) == ("error", "rate_limited")

        # A frame that does not act still passes: only the turn class is used up.
        assert (await request(ws, {"type": "ping"}))["type"] == "pong"

    assert _turns_in(db_sessions, conversation_id) == 4, "a refused turn stored nothing"

    other_id, other_token = make_user()
    other_conversation = conversation_of(other_id)
    async with http_calls.AsyncClient(base_url=gateways.urls[0], headers=bearer(other_token)) as c:
        response = await c.post(
            f"/api/conversations/{other_conversation}/turns", json={"text": "mine"}
        )
    assert response.status_code == 202, "another user's limit is their own"


async def test_each_class_of_mutating_route_is_limited_across_both_gateways(
    gateways: TwoGateways, make_user: Callable[[], tuple[str, str]]
) -> None:
    _user_id, token = make_user()
    clients = [http_calls.AsyncClient(base_url=u, headers=bearer(token)) for u in gateways.urls]
    async with clients[0], clients[1]:

        async def alternately(
            allowed: int, method: str, path: str, **kwargs: Any
        ) -> list[httpx.Response]:
            answers = []
            for i in range(allowed + 1):
                answers.append(await clients[i % 2].request(method, path, **kwargs))
            return answers

        *ok, over = await alternately(2, "POST", "/api/ws-tickets")
        assert [r.status_code for r in ok] == [200, 200]
        _refused(over)

        *ok, over = await alternately(3, "POST", "/api/conversations", json={})
        assert [r.status_code for r in ok] == [201, 201, 201]
        _refused(over)

        # Decisions are limited before the object is looked up: an unknown turn is 404 until
        # the class is used up, then 429.
        *ok, over = await alternately(2, "POST", "/api/turns/turn_nope/cancel")
        assert [r.status_code for r in ok] == [404, 404]
        _refused(over)

        *ok, over = await alternately(
            1, "POST", "/api/uploads?name=a.txt", content=b"hello", headers=bearer(token)
        )
        assert [r.status_code for r in ok] == [201]
        _refused(over)

        # Reads are never limited.
        for client in clients:
            assert (await client.get("/api/conversations")).status_code == 200


async def test_decision_frames_are_limited_over_websocket(
    gateways: TwoGateways, make_user: Callable[[], tuple[str, str]]
) -> None:
    _user_id, token = make_user()
    replies = []
    for url in (gateways.ws_urls[0], gateways.ws_urls[1], gateways.ws_urls[0]):
        async with websockets.connect(url, additional_headers=bearer(token)) as ws:
            frame = {"type": "cancel", "turn_id": "turn_nope"}
            replies.append(await request(ws, frame))
    assert [r.get("code") for r in replies] == ["not_found", "not_found", "rate_limited"]


def test_every_listed_route_exists_so_none_falls_back_to_writes_by_a_rename(
    gateway_settings: Callable[..., Any],
) -> None:
    from signalbox.services.gateway.app import create_app
    from signalbox.services.gateway.rate_limit import MUTATING_METHODS, ROUTE_ACTIONS

    paths = create_app(gateway_settings()).openapi()["paths"]
    for template in ROUTE_ACTIONS:
        methods = {m.upper() for m in paths.get(template, {})}
        assert methods & MUTATING_METHODS, f"{template} is not a mutating route of the gateway"
