"""One chaos deployment per module: every service a real process, on a PRIVATE Redis (so the
tests may kill and restart it) and a private SQLite database (so "no turn is left running"
can be checked over the whole database), with the fake Messages API as the model.

Two orchestrators and two tool workers, short leases and grace, a tiny visibility timeout
(so Redis redelivers long turns while they run) and the test-only tools and fault hook.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from websockets.sync.client import ClientConnection, connect

from signalbox.processes import Child, http_ok, log_contains, wait_until
from signalbox.redis_server import RedisServer, start_redis
from signalbox.shared.db import make_engine, make_session_factory
from signalbox.shared.db.models import Turn
from signalbox.shared.db.users import create_user
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.tool_contract import read_catalogue
from signalbox.stack import Stack, StackConfig, stop_services
from tests.databases import database_for
from tests.fake_anthropic import FakeAnthropic

LEASE_S = 4.0  # the default: a dead runner's turn is picked up within about this + a sweep
GRACE_S = 1.0
VISIBILITY_TIMEOUT_S = 3  # tiny: every turn or call longer than this is delivered twice
TOOL_LIMIT_S = 4.0  # of the test tools ``sleep`` and ``count_calls``
MAX_TURN_DELIVERIES = 2
POISON = "POISON-PILL"  # a turn whose text holds this kills every orchestrator that runs it
START_TIMEOUT_S = 60.0
WAIT_S = 30.0


def wait_for(check: Callable[[], Any], timeout_s: float = WAIT_S, what: str = "condition") -> Any:
    """``wait_until`` with this module's default deadline."""
    return wait_until(check, timeout_s, what)


@dataclass
class Chaos:
    """The deployment under test and the levers to break it."""

    stack: Stack
    redis_server: RedisServer
    redis_dir: Path
    sessions: sessionmaker[Session]
    fake: FakeAnthropic
    keys: RedisKeys
    redis: redis.Redis  # reconnects by itself after a Redis restart (same port)
    children: dict[str, Child] = field(default_factory=dict)

    # -- processes -------------------------------------------------------------------

    def _make(self, name: str) -> Child:
        s = self.stack
        env = s.env()
        if name.startswith("orchestrator"):
            env["SIGNALBOX_TEST_FAULT"] = f"kill_orchestrator_on_turn:{POISON}"
            args = s.commands.orchestrator(f"{name}@%h")
        elif name.startswith("tools"):
            args = s.commands.tools(f"{name}@%h")
        elif name == "gateway":
            args = s.commands.gateway(s.gateway_port)
        else:
            args = s.commands.proposals(s.proposals_port)
        log = s.config.var_dir / "logs" / f"{name}.log"
        return Child(name=name, args=args, log_path=log, env=env)

    def _ready(self, child: Child) -> Callable[[], bool]:
        if child.name == "gateway":
            return http_ok(f"{self.stack.gateway_url}/healthz")
        if child.name == "proposals":
            return http_ok(f"{self.stack.proposals_url}/healthz")
        return log_contains(child, " ready.")

    def start(self, *names: str, wait: bool = True) -> None:
        """Start (or restart) the named children in parallel; wait until all are ready."""
        for name in names:
            child = self.children.get(name) or self._make(name)
            self.children[name] = child
            child.start()
        if wait:
            self.wait_ready(*names)

    def wait_ready(self, *names: str) -> None:
        for name in names:
            child = self.children[name]
            child.wait_ready(self._ready(child), timeout_s=START_TIMEOUT_S)
        if any(n.startswith("tools") for n in names):
            wait_for(lambda: "sleep" in read_catalogue(self.redis, self.keys), what="catalogue")

    def ensure_up(self) -> None:
        """Restart whatever an earlier test left dead."""
        dead = [name for name, child in self.children.items() if not child.alive()]
        if dead:
            self.start(*dead)

    def kill(self, name: str) -> None:
        """SIGKILL a child's whole process group (a worker and its pool) and reap it."""
        child = self.children[name]
        child.signal_group(signal.SIGKILL)
        assert child.process is not None
        child.process.wait(timeout=10)

    def child_of_pid(self, pid: int) -> str:
        """The child whose process group holds ``pid`` (a pool process, or the main one)."""
        group = os.getpgid(pid)
        for name, child in self.children.items():
            if child.alive() and child.pid == group:
                return name
        raise AssertionError(f"no child owns pid {pid} (group {group})")

    def log_text(self, name: str) -> str:
        child = self.children[name]
        with open(child.log_path, "rb") as log:
            log.seek(child.log_start)
            return log.read().decode(errors="replace")

    def stop(self) -> None:
        stop_services(self.children.values())

    # -- Redis -----------------------------------------------------------------------

    def restart_redis_empty(self) -> None:
        """Stop the private redis-server and start a fresh, empty one on the same port."""
        self.redis_server.stop()
        self.redis_server = start_redis(
            self.redis_dir, persistent=False, port=self.redis_server.port
        )

    # -- SQL -------------------------------------------------------------------------

    def turn(self, turn_id: str) -> Turn:
        with self.sessions() as s:
            turn = s.get(Turn, turn_id)
            assert turn is not None, turn_id
            return turn

    def unfinished_turns(self) -> list[tuple[str, str]]:
        with self.sessions() as s:
            rows = s.execute(
                select(Turn.id, Turn.status).where(Turn.status.in_(("queued", "running", "parked")))
            )
            return [(turn_id, status) for turn_id, status in rows]

    def new_user(self) -> tuple[str, str]:
        with self.sessions() as s:
            user, token = create_user(s, f"chaos-{uuid.uuid4().hex[:8]}")
            s.commit()
            return user.id, token


def stack_env(fake: FakeAnthropic) -> dict[str, str]:
    """The chaos deployment's settings: short leases, grace and visibility timeout."""
    return {
        "ANTHROPIC_API_KEY": "sk-test",
        "ANTHROPIC_BASE_URL": fake.url,
        "SIGNALBOX_TEST_TOOLS": "1",
        "SIGNALBOX_LEASE_S": str(LEASE_S),
        "SIGNALBOX_RECONCILE_S": str(LEASE_S),  # parked and stale queued turns too
        "SIGNALBOX_TOOL_GRACE_S": str(GRACE_S),
        "SIGNALBOX_VISIBILITY_TIMEOUT_S": str(VISIBILITY_TIMEOUT_S),
        "SIGNALBOX_MAX_TURN_DELIVERIES": str(MAX_TURN_DELIVERIES),
        "SIGNALBOX_CATALOGUE_REFRESH_S": "1",
        "SIGNALBOX_TOOL_TIMEOUTS": json.dumps({"sleep": TOOL_LIMIT_S, "count_calls": TOOL_LIMIT_S}),
        "SIGNALBOX_HEARTBEAT_S": "1",
        "SIGNALBOX_RATE_LIMIT_PER_MINUTE": "100000",
        "SIGNALBOX_RATE_LIMIT_TURNS": "100000/minute",
        "SIGNALBOX_RATE_LIMIT_DECISIONS": "100000/minute",
    }


@pytest.fixture(scope="module")
def chaos(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, internal_token: str
) -> Iterator[Chaos]:
    var = tmp_path_factory.mktemp("chaos")
    redis_dir = var / "redis"
    server = start_redis(redis_dir, persistent=False)
    database_url = database_for(request, var, "chaos")
    engine = make_engine(database_url)
    fake = FakeAnthropic().start()
    config = StackConfig(
        var_dir=var,
        redis_url=server.url,
        database_url=database_url,
        internal_token=internal_token,
        orchestrators=2,
        tools_workers=2,
        extra_env=stack_env(fake),
    )
    stack = Stack(config)
    config.workspaces_root.mkdir(parents=True, exist_ok=True)
    chaos = Chaos(
        stack=stack,
        redis_server=server,
        redis_dir=redis_dir,
        sessions=make_session_factory(engine),
        fake=fake,
        keys=RedisKeys(config.redis_prefix),
        redis=redis.Redis.from_url(server.url, socket_timeout=5),
    )
    try:
        chaos.start("proposals", "gateway", "tools1", "tools2", "orchestrator1", "orchestrator2")
        yield chaos
    finally:
        chaos.stop()
        chaos.redis.close()
        fake.stop()
        chaos.redis_server.stop()
        engine.dispose()


class Client:
    """A WebSocket client of the gateway that keeps every event it receives."""

    def __init__(self, chaos: Chaos, token: str) -> None:
        url = chaos.stack.gateway_url.replace("http://", "ws://") + "/ws"
        self.ws: ClientConnection = connect(
            url, additional_headers={"Authorization": f"Bearer {token}"}, open_timeout=10
        )
        self.token = token
        self.events: list[dict[str, Any]] = []

    def close(self) -> None:
        self.ws.close()

    def _recv(self, deadline: float) -> dict[str, Any]:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        frame: dict[str, Any] = json.loads(self.ws.recv(timeout=left))
        if frame.get("type") == "event":
            self.events.append(frame)
        return frame

    def request(self, frame: dict[str, Any], timeout_s: float = 10.0) -> dict[str, Any]:
        """Send ``frame`` and return the reply carrying its ``req``."""
        req = uuid.uuid4().hex[:8]
        self.ws.send(json.dumps({**frame, "req": req}))
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                reply = self._recv(deadline)
            except TimeoutError:
                raise AssertionError(f"no reply to {frame} within {timeout_s} s") from None
            if reply.get("req") == req:
                return reply

    def wait(
        self, check: Callable[[dict[str, Any]], bool], timeout_s: float = WAIT_S, what: str = ""
    ) -> dict[str, Any]:
        """The first event (received or yet to come) that satisfies ``check``."""
        deadline = time.monotonic() + timeout_s
        index = 0
        while True:
            while index < len(self.events):
                event = self.events[index]
                index += 1
                if check(event):
                    return event
            try:
                self._recv(deadline)
            except TimeoutError:
                kinds = [(e["kind"], e["turn_id"]) for e in self.events]
                raise AssertionError(f"no event {what} within {timeout_s} s; got {kinds}") from None

    def of(self, turn_id: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["turn_id"] == turn_id]

    def kinds(self, turn_id: str) -> list[str]:
        return [e["kind"] for e in self.of(turn_id)]


def event(kind: str, turn_id: str, **data: Any) -> Callable[[dict[str, Any]], bool]:
    """A check: an event of ``kind`` of ``turn_id`` whose data has ``data``."""
    return lambda e: (
        e["kind"] == kind
        and e["turn_id"] == turn_id
        and all(e["data"].get(k) == v for k, v in data.items())
    )
