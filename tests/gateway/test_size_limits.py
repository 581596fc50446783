"""Oversized input is refused while it is read, before it is buffered (issue 12, findings 4, 6).

The attacks run against a real gateway process started as ``signalbox up`` starts it
(``ServiceCommands.gateway``), its memory read from ``/proc/<pid>/status``: ``VmHWM`` is the
peak resident size, so a frame or body held whole even for a moment shows there.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import websockets
from sqlalchemy.orm import Session, sessionmaker
from websockets.exceptions import ConnectionClosed

from signalbox.processes import Child, ServiceCommands, child_env, http_ok
from signalbox.redis_server import free_port
from signalbox.shared.db import Turn
from signalbox.shared.protocol import (
    MAX_ANSWER_CHARS,
    MAX_ID_CHARS,
    MAX_REASON_CHARS,
    MAX_TOOL_OUTPUT_CHARS,
    MAX_TURN_TEXT_CHARS,
)
from tests import http_calls
from tests.gateway.conftest import LiveGateway, bearer, connect, request
from tests.rawhttp import upload

pytestmark = pytest.mark.anyio

Users = Callable[[], tuple[str, str]]

MiB = 1024 * 1024
ATTACK_SOCKETS = 8
ATTACK_FRAME_BYTES = 15 * MiB
ATTACK_BODY_BYTES = 50 * MiB
# Far below what buffering would cost (8 x 15 MiB = 120 MiB), far above allocator noise.
MAX_GROWTH_BYTES = 40 * MiB
MESSAGE_TOO_BIG = 1009
CLOSE_TIMEOUT_S = 30.0
MAX_SENT_BYTES = 8 * MiB  # what loopback socket buffers take in before the answer is read


@dataclass
class GatewayProcess:
    """A gateway process and what a test needs to attack it."""

    child: Child
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def memory(self, field: str) -> int:
        """``VmRSS`` (now) or ``VmHWM`` (peak) of the process, in bytes."""
        status = Path(f"/proc/{self.child.pid}/status").read_text()
        for line in status.splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # reported in kB
        raise AssertionError(f"no {field} in /proc/{self.child.pid}/status")

    def reset_peak(self) -> None:
        """Start ``VmHWM`` again from the current size (Linux: ``clear_refs`` 5)."""
        Path(f"/proc/{self.child.pid}/clear_refs").write_text("5")


@pytest.fixture(scope="module")
def gateway_process(
    tmp_path_factory: pytest.TempPathFactory,
    redis_url: str,
    redis_prefix: str,
    database_url: str,
    internal_token: str,
) -> Iterator[GatewayProcess]:
    var = tmp_path_factory.mktemp("size-limits")
    env = child_env(
        {k: v for k, v in os.environ.items() if not k.startswith("SIGNALBOX_")},
        {
            "SIGNALBOX_REDIS_URL": redis_url,
            "SIGNALBOX_REDIS_PREFIX": f"{redis_prefix}size-{uuid.uuid4().hex[:6]}:",
            "SIGNALBOX_DATABASE_URL": database_url,
            "SIGNALBOX_INTERNAL_TOKEN": internal_token,
            "SIGNALBOX_WORKSPACES_ROOT": str(var / "workspaces"),
            "SIGNALBOX_LOG_LEVEL": "WARNING",
            # Off by default; on here, so the limit on a compressed frame's inflated size
            # is held where a deployment turns compression on.
            "SIGNALBOX_WS_PER_MESSAGE_DEFLATE": "true",
        },
    )
    port = free_port()
    child = Child("gateway", ServiceCommands().gateway(port), var / "gateway.log", env)
    child.start()
    try:
        child.wait_ready(http_ok(f"http://127.0.0.1:{port}/healthz"))
        yield GatewayProcess(child, port)
    finally:
        child.stop()


async def _send_oversized_frame(url: str, token: str, compression: str | None) -> int | None:
    """Send one 15 MiB text frame on a fresh socket; the close code the server sent."""
    payload = "x" * ATTACK_FRAME_BYTES
    async with websockets.connect(
        url, additional_headers=bearer(token), compression=compression, max_size=None
    ) as ws:
        try:
            await ws.send(payload)
            await asyncio.wait_for(ws.recv(), CLOSE_TIMEOUT_S)  # no reply: the server closes
        except ConnectionClosed:
            pass
        await asyncio.wait_for(ws.wait_closed(), CLOSE_TIMEOUT_S)
        extensions = [e.name for e in ws.protocol.extensions]
        assert extensions == (["permessage-deflate"] if compression else [])
        return ws.close_code


@pytest.mark.parametrize("compression", [None, "deflate"])
async def test_oversized_frames_close_1009_and_are_never_buffered(
    gateway_process: GatewayProcess,
    make_user: Callable[[], tuple[str, str]],
    compression: str | None,
) -> None:
    """15 MiB frames from 8 sockets at once; with ``deflate`` each is ~15 KiB on the wire and
    15 MiB once inflated (the limit holds on the inflated size too)."""
    _, token = make_user()
    ws_url = gateway_process.url.replace("http://", "ws://") + "/ws"
    gateway_process.reset_peak()
    before = gateway_process.memory("VmRSS")
    codes = await asyncio.gather(
        *(_send_oversized_frame(ws_url, token, compression) for _ in range(ATTACK_SOCKETS))
    )
    peak, after = gateway_process.memory("VmHWM"), gateway_process.memory("VmRSS")
    print(f"\ngateway RSS {before / MiB:.0f} MiB -> {after / MiB:.0f} MiB, peak {peak / MiB:.0f}")
    assert codes == [MESSAGE_TOO_BIG] * ATTACK_SOCKETS
    assert peak - before < MAX_GROWTH_BYTES
    assert after - before < MAX_GROWTH_BYTES
    async with http_calls.AsyncClient(base_url=gateway_process.url) as http:
        assert (await http.get("/healthz")).status_code == 200  # and it serves on


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize("path", ["/api/conversations", "/api/conversations/conv_x/turns"])
def test_an_oversized_body_is_refused_413_while_it_arrives(
    gateway_process: GatewayProcess, chunked: bool, path: str
) -> None:
    """50 MB bodies, declared or chunked, without a token: the body is read before auth."""
    gateway_process.reset_peak()
    before = gateway_process.memory("VmRSS")
    uploads = [upload(gateway_process.port, path, ATTACK_BODY_BYTES, chunked) for _ in range(4)]
    peak = gateway_process.memory("VmHWM")
    sent = [u.sent // MiB for u in uploads]
    print(f"\n{path} chunked={chunked}: sent {sent} MiB, peak {(peak - before) / MiB:.0f} MiB more")
    assert [u.status for u in uploads] == [413] * 4, uploads[0].response[:300]
    assert all(b"SIGNALBOX_HTTP_MAX_BODY_BYTES" in u.response for u in uploads)
    assert peak - before < MAX_GROWTH_BYTES
    assert all(u.sent < MAX_SENT_BYTES for u in uploads)  # answered long before the end


# -- the longest texts (docs/protocol.md, "Limits") ------------------------------------


def _turns(sessions: sessionmaker[Session], user_id: str) -> int:
    with sessions() as session:
        return len(session.scalars(sa.select(Turn.id).where(Turn.user_id == user_id)).all())


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_50_mb_turn_text_over_http_is_refused_and_nothing_is_stored(
    gateway: LiveGateway,
    make_user: Users,
    conversation_of: Callable[[str], str],
    db_sessions: sessionmaker[Session],
    chunked: bool,
) -> None:
    user_id, token = make_user()
    path = f"/api/conversations/{conversation_of(user_id)}/turns"
    answer = upload(gateway.port, path, ATTACK_BODY_BYTES, chunked, bearer(token))
    assert answer.status == 413 and answer.sent < MAX_SENT_BYTES
    assert _turns(db_sessions, user_id) == 0


def test_the_longest_turn_text_is_taken_over_http_and_one_more_character_is_not(
    gateway: LiveGateway,
    make_user: Users,
    conversation_of: Callable[[str], str],
    db_sessions: sessionmaker[Session],
) -> None:
    user_id, token = make_user()
    url = f"{gateway.url}/api/conversations/{conversation_of(user_id)}/turns"
    with http_calls.Client(headers=bearer(token), timeout=CLOSE_TIMEOUT_S) as http:
        longest = http.post(url, json={"text": "é" * MAX_TURN_TEXT_CHARS})
        over = http.post(url, json={"text": "x" * (MAX_TURN_TEXT_CHARS + 1)})
    assert longest.status_code == 202, longest.text
    assert over.status_code == 422
    assert over.json()["detail"][0]["loc"] == ["body", "text"]
    assert _turns(db_sessions, user_id) == 1


async def test_the_longest_turn_text_is_taken_over_the_websocket_and_one_more_is_not(
    gateway: LiveGateway, make_user: Users, db_sessions: sessionmaker[Session]
) -> None:
    user_id, token = make_user()
    async with await connect(gateway, token, max_size=None) as ws:
        over = await request(ws, {"type": "user_turn", "text": "x" * (MAX_TURN_TEXT_CHARS + 1)})
        # Python's json.dumps sends "\u00e9": 6 bytes a character, still under 1 MiB.
        longest = await request(ws, {"type": "user_turn", "text": "é" * MAX_TURN_TEXT_CHARS})
    assert (over["type"], over["code"]) == ("error", "bad_frame")
    assert f"text: String should have at most {MAX_TURN_TEXT_CHARS} characters" in over["message"]
    assert longest["type"] == "ack"
    assert _turns(db_sessions, user_id) == 1


OVER_LIMIT_CASES = {
    "answer": ({"type": "answer", "question_id": "call_x"}, "text", MAX_ANSWER_CHARS),
    "tool_result": (
        {"type": "tool_result", "call_id": "call_x", "token": "t"},
        "output",
        MAX_TOOL_OUTPUT_CHARS,
    ),
    "decide_tool": (
        {"type": "decide_tool", "call_id": "call_x", "decision": "deny"},
        "reason",
        MAX_REASON_CHARS,
    ),
    "decide_proposal": (
        {"type": "decide_proposal", "proposal_id": "prop_x", "decision": "reject"},
        "reason",
        MAX_REASON_CHARS,
    ),
    "cancel": ({"type": "cancel"}, "turn_id", MAX_ID_CHARS),
    "subscribe": ({"type": "subscribe"}, "conversation_id", MAX_ID_CHARS),
}


@pytest.mark.parametrize(
    ("frame", "field", "limit"), OVER_LIMIT_CASES.values(), ids=OVER_LIMIT_CASES.keys()
)
async def test_each_free_text_of_a_frame_has_its_maximum(
    gateway: LiveGateway, make_user: Users, frame: dict[str, Any], field: str, limit: int
) -> None:
    _, token = make_user()
    async with await connect(gateway, token) as ws:
        reply = await request(ws, {**frame, field: "x" * (limit + 1)})
        at_limit = await request(ws, {**frame, field: "x" * limit})
    assert (reply["type"], reply["code"]) == ("error", "bad_frame")
    assert f"{field}: String should have at most {limit} characters" in reply["message"]
    assert at_limit.get("code") != "bad_frame"  # the limit itself passes (then: not_found)
