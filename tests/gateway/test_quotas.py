"""Quotas on stored things: past one, a clear ``quota_exceeded`` (HTTP 403, WebSocket error)
and nothing half-written — also when creations race for the last slot."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from signalbox.shared.db import Conversation, Turn, Upload
from tests import http_calls
from tests.gateway.conftest import LiveGateway, bearer, connect, request

pytestmark = pytest.mark.anyio


def _count(sessions: sessionmaker[Session], model: type, user_id: str) -> int:
    with sessions() as s:
        where = model.user_id == user_id  # type: ignore[attr-defined]
        return int(s.scalar(select(func.count()).select_from(model).where(where)) or 0)


def _refused(reply: httpx.Response) -> None:
    assert reply.status_code == 403, reply.text
    assert reply.json()["code"] == "quota_exceeded"


async def test_conversations_past_the_quota_are_refused_over_http_and_websocket(
    start_gateway: Callable[..., LiveGateway],
    make_user: Callable[[], tuple[str, str]],
    db_sessions: sessionmaker[Session],
) -> None:
    gw = start_gateway(quota_conversations=2)
    user_id, token = make_user()
    async with http_calls.AsyncClient(base_url=gw.url, headers=bearer(token)) as http:
        first = (await http.post("/api/conversations", json={})).json()
        assert (await http.post("/api/conversations", json={})).status_code == 201
        over = await http.post("/api/conversations", json={})
        _refused(over)
        assert "quota of 2 conversations" in over.json()["detail"]

        ws = await connect(gw, token)
        async with ws:
            reply = await request(ws, {"type": "user_turn", "text": "a new conversation"})
        assert (reply["type"], reply["code"]) == ("error", "quota_exceeded")
        assert _count(db_sessions, Conversation, user_id) == 2
        assert _count(db_sessions, Turn, user_id) == 0, "no turn without its conversation"

        # Archiving one frees its slot.
        assert (
            await http.delete(f"/api/conversations/{first['conversation_id']}")
        ).status_code == 200
        assert (await http.post("/api/conversations", json={})).status_code == 201


async def test_creations_racing_for_the_last_slots_never_pass_the_quota(
    start_gateway: Callable[..., LiveGateway],
    make_user: Callable[[], tuple[str, str]],
    db_sessions: sessionmaker[Session],
) -> None:
    gw = start_gateway(quota_conversations=3)
    user_id, token = make_user()
    async with http_calls.AsyncClient(base_url=gw.url, headers=bearer(token)) as http:
        replies = await asyncio.gather(
            *(http.post("/api/conversations", json={}) for _ in range(8))
        )
    assert sorted(r.status_code for r in replies) == [201] * 3 + [403] * 5
    assert _count(db_sessions, Conversation, user_id) == 3


async def test_workspaces_past_the_quota_are_refused_and_an_existing_one_is_not_counted(
    start_gateway: Callable[..., LiveGateway], make_user: Callable[[], tuple[str, str]]
) -> None:
    gw = start_gateway(quota_workspaces=2)
    _user_id, token = make_user()
    async with http_calls.AsyncClient(base_url=gw.url, headers=bearer(token)) as http:
        for name in ("alpha", "beta", "alpha"):
            reply = await http.post("/api/workspaces", json={"name": name})
            assert reply.status_code == 201, reply.text
        _refused(await http.post("/api/workspaces", json={"name": "gamma"}))
        _refused(await http.post("/api/conversations", json={"workspace": "gamma"}))
        assert (
            await http.post("/api/conversations", json={"workspace": "beta"})
        ).status_code == 201


async def test_uploads_past_their_count_or_bytes_are_refused_and_not_stored(
    start_gateway: Callable[..., LiveGateway],
    make_user: Callable[[], tuple[str, str]],
    db_sessions: sessionmaker[Session],
) -> None:
    gw = start_gateway(quota_uploads=3, quota_upload_bytes=11)
    user_id, token = make_user()
    async with http_calls.AsyncClient(base_url=gw.url, headers=bearer(token)) as http:
        assert (await http.post("/api/uploads", content=b"12345678")).status_code == 201
        over_bytes = await http.post("/api/uploads", content=b"12345678")
        _refused(over_bytes)
        assert "bytes of uploads" in over_bytes.json()["detail"]
        assert (await http.post("/api/uploads", content=b"1")).status_code == 201
        assert (await http.post("/api/uploads", content=b"1")).status_code == 201
        over_count = await http.post("/api/uploads", content=b"1")  # 11 bytes fit; 4 do not
        _refused(over_count)
        assert "quota of 3 uploads" in over_count.json()["detail"]
        quotas = {q["name"]: q for q in (await http.get("/api/me/quotas")).json()["quotas"]}
        metrics = (await http.get("/metrics")).text
    assert (quotas["uploads"]["held"], quotas["upload_bytes"]["held"]) == (3, 10)
    assert _count(db_sessions, Upload, user_id) == 3
    assert 'signalbox_gateway_quota_refusals_total{quota="upload_bytes",user_class="user"}' in (
        metrics
    )
