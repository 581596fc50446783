"""WebSocket fuzz: hypothesis throws frame shapes at a real gateway (uvicorn in a thread).

Random JSON values, every field of every client frame given a wrong type, huge strings,
deeply nested junk, binary frames, broken UTF-8, and junk in the handshake. Whatever comes
in, the gateway answers ``error`` (or, for a frame that happens to be valid, ``ack`` or
``pong``) or closes the socket with a protocol code; it never logs a crash, never answers
HTTP 5xx, and a fresh socket still works afterwards.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import httpx
import pytest
import uvicorn
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from sqlalchemy.orm import Session, sessionmaker
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from signalbox.redis_server import free_port
from signalbox.services.gateway.app import create_app, server_config
from signalbox.shared.db.users import create_user
from signalbox.shared.protocol import ClientFrame, ErrorCode
from signalbox.shared.settings import GatewaySettings
from tests import http_calls

MAX_FRAME_BYTES = 16 * 1024  # small, so "huge" frames are cheap to make
PROTOCOL_CLOSE_CODES = {1003, 1007, 1008, 1009, 1011, 1013}
ERROR_CODES = set(get_args(ErrorCode))
REPLY_TIMEOUT_S = 30.0  # a hang still fails; a connect on loaded cores took 2.5 s
START_TIMEOUT_S = 10.0


class _Errors(logging.Handler):
    """Keeps every ERROR record of the gateway and of uvicorn (a crash logs one)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith(("signalbox.services.gateway", "uvicorn")):
            self.records.append(record)


class _Gateway:
    def __init__(self, settings: GatewaySettings, token: str) -> None:
        self.port = free_port()
        self.token = token
        config = server_config(
            create_app(settings), settings, "127.0.0.1", self.port, log_level="warning"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.socket: ClientConnection | None = None

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def connect(self, **headers: str) -> ClientConnection:
        return connect(
            f"ws://127.0.0.1:{self.port}/ws",
            additional_headers=headers or {"Authorization": f"Bearer {self.token}"},
            open_timeout=REPLY_TIMEOUT_S,
            max_size=None,
        )

    def open_socket(self) -> ClientConnection:
        """The socket the fuzz examples share, reopened after the gateway closed it."""
        if self.socket is None:
            self.socket = self.connect()
        return self.socket


@pytest.fixture(scope="module")
def errors() -> Iterator[_Errors]:
    handler = _Errors()
    logging.getLogger().addHandler(handler)
    yield handler
    logging.getLogger().removeHandler(handler)


@pytest.fixture(scope="module")
def gateway(
    redis_url: str,
    redis_prefix: str,
    database_url: str,
    internal_token: str,
    db_sessions: sessionmaker[Session],
    tmp_path_factory: pytest.TempPathFactory,
    errors: _Errors,
) -> Iterator[_Gateway]:
    with db_sessions() as s:
        _user, token = create_user(s, f"fuzz-{uuid.uuid4().hex[:8]}")
        s.commit()
    workspaces: Path = tmp_path_factory.mktemp("fuzz-workspaces")
    settings = GatewaySettings(
        redis_url=redis_url,
        redis_prefix=f"{redis_prefix}fuzz-{uuid.uuid4().hex[:6]}:",
        database_url=database_url,
        internal_token=internal_token,
        workspaces_root=workspaces,
        proposals_url=f"http://127.0.0.1:{free_port()}",  # nothing listens: `unavailable`
        ws_max_frame_bytes=MAX_FRAME_BYTES,
        rate_limit_per_minute=1_000_000,
    )
    gw = _Gateway(settings, token)
    gw.thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not gw.server.started:
        assert gw.thread.is_alive() and time.monotonic() < deadline, "gateway did not start"
        time.sleep(0.01)  # another thread's start-up: polled, with a deadline
    yield gw
    if gw.socket is not None:
        gw.socket.close()
    gw.server.should_exit = True
    gw.thread.join(timeout=10)


# -- strategies ----------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)

_FRAME_MODELS: list[type[BaseModel]] = list(get_args(get_args(ClientFrame)[0]))
_FIELDS = {
    model.model_fields["type"].annotation.__args__[0]: [  # type: ignore[union-attr]
        name for name in model.model_fields if name != "type"
    ]
    for model in _FRAME_MODELS
}


@st.composite
def mistyped_frames(draw: st.DrawFn) -> dict[str, Any]:
    """A frame of a real type whose fields each hold a plausible or a random JSON value."""
    kind = draw(st.sampled_from(sorted(_FIELDS)))
    frame: dict[str, Any] = {"type": kind}
    for name in _FIELDS[kind]:
        choice = draw(st.integers(0, 3))
        if choice == 0:
            continue  # missing
        frame[name] = draw(st.text(max_size=20) if choice == 1 else json_values)
    return frame


@st.composite
def huge_frames(draw: st.DrawFn) -> str:
    """A frame near or far past the size limit (multi-byte characters count as bytes)."""
    size = draw(st.sampled_from([MAX_FRAME_BYTES - 64, MAX_FRAME_BYTES + 1, 4 * MAX_FRAME_BYTES]))
    char = draw(st.sampled_from(["x", "é", "😀"]))
    text = char * (size // len(char.encode()))
    return json.dumps({"type": "user_turn", "text": text, "conversation_id": None})


@st.composite
def nested_junk(draw: st.DrawFn) -> str:
    """Deeply nested arrays or objects, inside a frame or on their own."""
    depth = draw(st.integers(50, 5000))
    opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
    junk = opener * depth + "1" + closer * depth
    return draw(st.sampled_from([junk, f'{{"type": "ping", "req": {junk}}}']))


frames = st.one_of(
    json_values.map(json.dumps),
    mistyped_frames().map(json.dumps),
    st.builds(
        lambda f, key, value: json.dumps({**f, key: value}),
        mistyped_frames(),
        st.sampled_from(["req", "type"]),
        json_values,
    ),
    huge_frames(),
    nested_junk(),
    st.text(max_size=200),
    st.binary(max_size=200),
)


# -- the checks ----------------------------------------------------------------------------


def _answer(gw: _Gateway, frame: str | bytes) -> None:
    """Send one frame; the next reply must be a protocol reply, or a protocol close."""
    ws = gw.open_socket()
    try:
        ws.send(frame)
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while True:
            reply = json.loads(ws.recv(timeout=max(0.01, deadline - time.monotonic())))
            if reply.get("type") in ("event", "heartbeat"):
                continue
            assert reply.get("type") in ("error", "ack", "pong"), reply
            if reply["type"] == "error":
                assert reply["code"] in ERROR_CODES, reply
            return
    except ConnectionClosed as closed:
        gw.socket = None
        code = closed.rcvd.code if closed.rcvd is not None else None
        assert code in PROTOCOL_CLOSE_CODES, f"closed with {code!r} after {frame[:200]!r}"
    except TimeoutError:
        raise AssertionError(f"no reply within {REPLY_TIMEOUT_S} s to {frame[:200]!r}") from None


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(frame=frames)
@example(frame="[" * 3000 + "]" * 3000)  # deeper than Python's recursion limit
@example(frame=b"\xff\xfe not utf-8")
@example(frame=json.dumps({"type": ["ping"], "req": {"a": 1}}))
def test_any_frame_gets_a_protocol_answer(
    gateway: _Gateway, errors: _Errors, frame: str | bytes
) -> None:
    before = len(errors.records)
    _answer(gateway, frame)
    crashes = [r.getMessage() for r in errors.records[before:]]
    assert crashes == [], f"{crashes} after {frame[:200]!r}"


header_text = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=0, max_size=80
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(authorization=header_text, ticket=header_text, origin=header_text)
def test_a_junk_handshake_is_refused_not_crashed(
    gateway: _Gateway, authorization: str, ticket: str, origin: str
) -> None:
    url = f"ws://127.0.0.1:{gateway.port}/ws?" + httpx.QueryParams({"ticket": ticket}).__str__()
    headers = {"Authorization": authorization, "Origin": origin}
    try:
        ws = connect(url, additional_headers=headers, open_timeout=REPLY_TIMEOUT_S)
    except InvalidStatus as refused:
        assert refused.response.status_code < 500, refused.response.status_code
    else:
        ws.close()  # a junk header that happens to be a live token cannot occur; be safe


def test_the_gateway_is_healthy_after_the_fuzz(gateway: _Gateway, errors: _Errors) -> None:
    assert http_calls.get(f"{gateway.http}/healthz").status_code == 200
    assert http_calls.get(f"{gateway.http}/readyz").status_code == 200
    with gateway.connect() as ws:
        ws.send(json.dumps({"type": "ping", "req": "after"}))
        reply = json.loads(ws.recv(timeout=REPLY_TIMEOUT_S))
        while reply.get("type") == "heartbeat":
            reply = json.loads(ws.recv(timeout=REPLY_TIMEOUT_S))
        assert reply == {"type": "pong", "req": "after"}
    crashes = [f"{r.name}: {r.getMessage()}" for r in errors.records]
    assert crashes == [], crashes
