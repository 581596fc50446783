"""A real gateway on uvicorn in a thread, and WebSocket helpers with deadlines."""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import uvicorn
import websockets
from sqlalchemy.orm import Session, sessionmaker
from websockets.asyncio.client import ClientConnection

from signalbox.redis_server import free_port
from signalbox.services.gateway.app import create_app, server_config
from signalbox.services.proposals.app import create_app as create_proposals_app
from signalbox.shared.celery_app import ORCHESTRATOR_QUEUE
from signalbox.shared.db import Conversation, Message, ToolCall, Turn
from signalbox.shared.ids import new_id
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.settings import GatewaySettings

START_TIMEOUT_S = 10.0
RECV_TIMEOUT_S = 30.0  # a deadline to wait for a frame, generous for a loaded machine


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class ServerThread:
    """An ASGI app on a real uvicorn server in a thread of the test process."""

    def __init__(
        self, app: Any, port: int | None = None, config: uvicorn.Config | None = None
    ) -> None:
        self.port = port or free_port()
        config = config or uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.01)  # another thread's start-up: polled, with a deadline

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


class LiveGateway(ServerThread):
    """One gateway: the real app from ``create_app`` on a real uvicorn server, configured by
    the gateway's own ``server_config`` (its frame limit enforced while reading)."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.app = create_app(settings)
        port = free_port()
        config = server_config(self.app, settings, "127.0.0.1", port, log_level="warning")
        super().__init__(self.app, port, config)
        self.settings = settings
        self.keys = RedisKeys(settings.redis_prefix)

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"


@pytest.fixture(scope="session")
def gateway_settings(
    redis_url: str,
    redis_prefix: str,
    database_url: str,
    internal_token: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[..., GatewaySettings]:
    """A factory of settings; each call gets its own key prefix (and so its own Celery queue)."""
    root: Path = tmp_path_factory.mktemp("gateway-workspaces")

    def make(**overrides: Any) -> GatewaySettings:
        values: dict[str, Any] = {
            "redis_url": redis_url,
            "redis_prefix": f"{redis_prefix}gw-{uuid.uuid4().hex[:8]}:",
            "database_url": database_url,
            "internal_token": internal_token,
            "workspaces_root": root,
            "proposals_url": f"http://127.0.0.1:{free_port()}",  # nothing listens unless set
            # Events relayed only when their writer rings: one that forgot would wait for the
            # sweep, past every test's deadline.
            "relay_sweep_s": 120.0,
        }
        values.update(overrides)
        return GatewaySettings(**values)

    return make


@pytest.fixture
def start_gateway(
    gateway_settings: Callable[..., GatewaySettings],
) -> Iterator[Callable[..., LiveGateway]]:
    """A factory: start a gateway with settings overrides; all are stopped after the test."""
    started: list[LiveGateway] = []

    def start(**overrides: Any) -> LiveGateway:
        gateway = LiveGateway(gateway_settings(**overrides))
        gateway.start()
        started.append(gateway)
        return gateway

    yield start
    for gateway in started:
        gateway.stop()


@pytest.fixture
def proposals(service_env: dict[str, str]) -> Iterator[ServerThread]:
    """The real proposals service on its own server."""
    server = ServerThread(create_proposals_app())
    server.start()
    yield server
    server.stop()


@pytest.fixture
def gw(
    start_gateway: Callable[..., LiveGateway],
    proposals: ServerThread,
    service_env: dict[str, str],
) -> LiveGateway:
    """A gateway that asks the real ``proposals`` service and keeps workspaces where it does."""
    return start_gateway(
        proposals_url=proposals.url,
        workspaces_root=Path(service_env["SIGNALBOX_WORKSPACES_ROOT"]),
    )


@pytest.fixture
def conversation_of(db_sessions: sessionmaker[Session]) -> Callable[[str], str]:
    """A factory: a new conversation of ``user_id`` (no events yet)."""

    def make(user_id: str) -> str:
        with db_sessions() as session:
            conversation = Conversation(id=new_id("conv"), user_id=user_id, workspace="default")
            session.add(conversation)
            session.commit()
            return conversation.id

    return make


@pytest.fixture
def gateway(start_gateway: Callable[..., LiveGateway]) -> LiveGateway:
    """A gateway with default settings."""
    return start_gateway()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def connect(gw: LiveGateway, token: str, **kwargs: Any) -> ClientConnection:
    """A WebSocket to ``gw`` authenticated with ``token``."""
    return await websockets.connect(gw.ws_url, additional_headers=bearer(token), **kwargs)


async def recv(ws: ClientConnection, timeout_s: float = RECV_TIMEOUT_S) -> dict[str, Any]:
    """The next frame, skipping heartbeats; fails after ``timeout_s``."""
    import asyncio

    while True:
        frame: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), timeout_s))
        if frame.get("type") != "heartbeat":
            return frame


# Events that arrived while a test waited for a reply: an event may overtake the ack.
_stashed: weakref.WeakKeyDictionary[ClientConnection, list[dict[str, Any]]] = (
    weakref.WeakKeyDictionary()
)


async def request(ws: ClientConnection, frame: dict[str, Any]) -> dict[str, Any]:
    """Send ``frame`` with a fresh ``req`` and return the reply carrying it (events kept)."""
    req = uuid.uuid4().hex[:8]
    await ws.send(json.dumps({**frame, "req": req}))
    while True:
        reply = await recv(ws)
        if reply.get("req") == req:
            return reply
        if reply["type"] == "event":
            _stashed.setdefault(ws, []).append(reply)


async def events_until(
    ws: ClientConnection, done: Callable[[list[dict[str, Any]]], bool]
) -> list[dict[str, Any]]:
    """Collect event frames (first those stashed by ``request``) until ``done(events)`` holds."""
    events: list[dict[str, Any]] = _stashed.pop(ws, [])
    while not done(events):
        frame = await recv(ws)
        if frame["type"] == "event":
            events.append(frame)
    return events


def queued_messages(client: redis.Redis, keys: RedisKeys, queue: str) -> list[dict[str, Any]]:
    """The Celery messages waiting on this deployment's ``queue``, oldest first."""
    raws: Any = client.lrange(f"{keys.prefix}{queue}", 0, -1)
    return [json.loads(raw) for raw in reversed(raws)]  # kombu LPUSHes and BRPOPs


def queued_turn_tasks(client: redis.Redis, keys: RedisKeys) -> list[tuple[str, list[Any]]]:
    """(task name, args) of each message on this deployment's orchestrator queue, oldest first."""
    found = []
    for message in queued_messages(client, keys, ORCHESTRATOR_QUEUE):
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        found.append((message["headers"]["task"], args))
    return found


# -- rows as the orchestrator writes them ---------------------------------------------


def add_turn(
    sessions: sessionmaker[Session],
    user_id: str,
    conversation_id: str,
    status: str,
    parent_call_id: str | None = None,
    **fields: Any,
) -> str:
    """A turn row in ``status``, as the orchestrator leaves it (nothing enqueued); ``fields``:
    other columns (``deployment``, ``admitted_at``...)."""
    with sessions() as session:
        turn = Turn(
            id=new_id("turn"),
            conversation_id=conversation_id,
            user_id=user_id,
            seq=1,
            text="go",
            status=status,
            parent_call_id=parent_call_id,
            **fields,
        )
        session.add(turn)
        session.commit()
        return turn.id


def add_call(
    sessions: sessionmaker[Session], turn_id: str, conversation_id: str, **fields: Any
) -> str:
    """A tool call of ``turn_id`` (a fresh assistant message holds its tool_use)."""
    with sessions() as session:
        message = Message(
            id=new_id("msg"),
            conversation_id=conversation_id,
            turn_id=turn_id,
            seq=fields.pop("seq", 1),
            role="assistant",
            content=[{"type": "tool_use", "id": "tu", "name": "run_python", "input": {}}],
        )
        session.add(message)
        session.flush()
        values: dict[str, Any] = {
            "tool": "run_python",
            "input": {"code": "1+1"},
            "status": "needs_decision",
            **fields,
        }
        call = ToolCall(
            id=new_id("call"),
            turn_id=turn_id,
            message_id=message.id,
            position=0,
            tool_use_id="tu",
            **values,
        )
        session.add(call)
        session.commit()
        return call.id
