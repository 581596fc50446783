"""Frame handling on an accepted socket: replies echo ``req``, bad frames keep it open."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import pytest
import websockets

from tests.gateway.conftest import LiveGateway, connect, recv, request

pytestmark = pytest.mark.anyio

WAIT_S = 30.0  # a deadline to wait for a frame, generous for a loaded machine


async def test_ping_gets_pong_echoing_req(
    gateway: LiveGateway, make_user: Callable[[], tuple[str, str]]
) -> None:
    _, token = make_user()
    async with await connect(gateway, token) as ws:
        await ws.send(json.dumps({"type": "ping", "req": "r-1"}))
        assert await recv(ws) == {"type": "pong", "req": "r-1"}


async def test_non_json_frame_is_bad_frame_and_socket_stays_open(
    gateway: LiveGateway, make_user: Callable[[], tuple[str, str]]
) -> None:
    _, token = make_user()
    async with await connect(gateway, token) as ws:
        await ws.send("this is {not json")
        reply = await recv(ws)
        assert reply["type"] == "error"
        assert reply["code"] == "bad_frame"
        assert (await request(ws, {"type": "ping"}))["type"] == "pong"


async def test_unknown_type_and_bad_field_are_errors_echoing_req(
    gateway: LiveGateway, make_user: Callable[[], tuple[str, str]]
) -> None:
    _, token = make_user()
    async with await connect(gateway, token) as ws:
        reply = await request(ws, {"type": "launch_missiles"})
        assert (reply["type"], reply["code"]) == ("error", "unknown_type")
        reply = await request(ws, {"type": "decide_tool", "call_id": "c", "decision": "maybe"})
        assert (reply["type"], reply["code"]) == ("error", "bad_frame")
        assert "decision" in reply["message"]
        assert (await request(ws, {"type": "ping"}))["type"] == "pong"


NUL = "a\u0000b"
# Every frame that names an id or carries a text, with a NUL there: PostgreSQL cannot store
# one, so each must be refused as input (bad_frame), never reach SQL (error internal).
NUL_FRAMES = [
    {"type": "subscribe", "conversation_id": NUL},
    {"type": "user_turn", "text": NUL},
    {"type": "user_turn", "text": "hi", "conversation_id": NUL},
    {"type": "user_turn", "text": "hi", "client_turn_id": NUL},
    {"type": "cancel", "turn_id": NUL},
    {"type": "decide_tool", "call_id": "c", "decision": "deny", "reason": NUL},
    {"type": "decide_proposal", "proposal_id": "p", "decision": "reject", "reason": NUL},
    {"type": "answer", "question_id": "q", "text": NUL},
    {"type": "tool_result", "call_id": "c", "token": "t", "output": NUL},
]


async def test_a_nul_in_any_id_or_text_is_a_bad_frame(
    gateway: LiveGateway, make_user: Callable[[], tuple[str, str]]
) -> None:
    _, token = make_user()
    async with await connect(gateway, token) as ws:
        for frame in NUL_FRAMES:
            reply = await request(ws, frame)
            assert (reply["type"], reply.get("code")) == ("error", "bad_frame"), (frame, reply)
        assert (await request(ws, {"type": "ping"}))["type"] == "pong"


async def test_frame_over_max_size_closes_with_1009(
    start_gateway: Callable[..., LiveGateway], make_user: Callable[[], tuple[str, str]]
) -> None:
    gateway = start_gateway(ws_max_frame_bytes=2048)
    _, token = make_user()
    async with await connect(gateway, token) as ws:
        # Padded with a field the server ignores (`req` has its own maximum, 200).
        under = json.dumps({"type": "ping", "padding": "x" * 1900})
        await ws.send(under)
        assert (await recv(ws))["type"] == "pong"
        await ws.send(json.dumps({"type": "ping", "padding": "x" * 3000}))
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await recv(ws)
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 1009


async def test_an_answer_to_an_unknown_question_is_not_found(
    gateway: LiveGateway, make_user: Callable[[], tuple[str, str]]
) -> None:
    _, token = make_user()
    async with await connect(gateway, token) as ws:
        reply = await request(ws, {"type": "answer", "question_id": "q", "text": "yes"})
        assert (reply["type"], reply["code"]) == ("error", "not_found")


async def test_idle_socket_gets_heartbeats(
    start_gateway: Callable[..., LiveGateway], make_user: Callable[[], tuple[str, str]]
) -> None:
    gateway = start_gateway(heartbeat_s=0.2)
    _, token = make_user()
    async with await connect(gateway, token) as ws:
        frame = json.loads(await ws.recv())
        assert frame["type"] == "heartbeat"
        assert frame["ts"].endswith("Z")


async def test_frames_over_the_rate_limit_are_refused(
    start_gateway: Callable[..., LiveGateway], make_user: Callable[[], tuple[str, str]]
) -> None:
    gateway = start_gateway(rate_limit_per_minute=3)
    _, token = make_user()
    async with await connect(gateway, token) as ws:
        replies = [await request(ws, {"type": "ping"}) for _ in range(4)]
        assert [r["type"] for r in replies[:3]] == ["pong"] * 3
        assert (replies[3]["type"], replies[3]["code"]) == ("error", "rate_limited")


async def test_a_socket_whose_client_sends_nothing_is_closed_1001(
    start_gateway: Callable[..., LiveGateway], make_user: Callable[[], tuple[str, str]]
) -> None:
    """Server heartbeats flow all along, yet only the client's own frames keep it open."""
    # About 15 heartbeats are due before the idle timeout: two still come through a stall of
    # 2.5 s on a loaded machine.
    gateway = start_gateway(heartbeat_s=0.2, ws_idle_timeout_s=3.0)
    _, token = make_user()
    async with await connect(gateway, token) as ws:
        heartbeats = 0
        with pytest.raises(websockets.ConnectionClosed) as closed:
            while True:
                frame = json.loads(await asyncio.wait_for(ws.recv(), WAIT_S))
                assert frame["type"] == "heartbeat"
                heartbeats += 1
        assert heartbeats >= 2
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 1001


async def test_a_client_that_keeps_talking_is_not_idle(
    start_gateway: Callable[..., LiveGateway], make_user: Callable[[], tuple[str, str]]
) -> None:
    # Pings every 0.2 s against a 5 s idle timeout: a stall of 4.5 s between two of them on
    # a loaded machine (client and gateway share this process) still leaves the socket open.
    gateway = start_gateway(ws_idle_timeout_s=5.0)
    _, token = make_user()
    async with await connect(gateway, token) as ws:
        started = time.monotonic()
        while time.monotonic() - started < 10.0:  # two idle timeouts' worth of time
            assert (await request(ws, {"type": "ping"}))["type"] == "pong"
            await asyncio.sleep(0.2)  # the client's own pace, well inside the timeout
        assert (await request(ws, {"type": "ping"}))["type"] == "pong"
