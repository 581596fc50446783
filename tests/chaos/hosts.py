"""A Signalbox deployment over several hosts on one machine (``netns.py``), and its clients.

Hosts: ``redis`` and ``sql`` (the data host, as two namespaces so that a partition can cut
Redis and PostgreSQL apart: "cut the proposals service from Redis" leaves it its SQL),
``gw1``/``gw2`` (a gateway each), ``orch1``/``orch2``, ``tools1``/``tools2``, and
``proposals``. Every service is started with the command line ``ServiceCommands`` gives it
(what ``signalbox up`` and docker-compose run), prefixed by ``ip netns exec``; the redis
server is the machine's ``redis-server`` and PostgreSQL a private cluster (``initdb``, run
as the ``postgres`` user) inside the ``sql`` namespace. The test process, in the root
namespace, is every host's client and serves the fake Messages API on the bridge.

``RoamingClient`` is a WebSocket client as a real one should be written: it pings a silent
socket, gives a gateway up when the pong does not come, and reconnects to the next gateway
with the last event id it saw of each conversation, counting every event it gets.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import pwd
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import redis
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from signalbox.processes import Child, ServiceCommands, child_env, http_ok, log_contains
from signalbox.processes import wait_until as _wait_until
from signalbox.redis_server import server_binary
from signalbox.shared.db import make_engine, make_session_factory
from signalbox.shared.db.migrate import upgrade
from signalbox.shared.db.models import Turn
from signalbox.shared.db.users import create_user
from signalbox.shared.event_stream import EventStream, id_after
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.tool_contract import read_catalogue
from tests.chaos.netns import Host, Network
from tests.fake_anthropic import FakeAnthropic

REDIS_PORT = 6379
PG_PORT = 5432
GATEWAY_PORT = 8000
PROPOSALS_PORT = 8100
METRICS_PORT = 9100
START_TIMEOUT_S = 90.0  # nine hosts' processes starting at once on 2 loaded cores
GATEWAYS = ("gw1", "gw2")
ORCHESTRATORS = ("orch1", "orch2")
TOOL_HOSTS = ("tools1", "tools2")
TOOL_LIMIT_S = 30.0  # of count_calls: far beyond any detection, so "lost" means detected


def wait_for(check: Callable[[], Any], timeout_s: float = 60.0, what: str = "condition") -> Any:
    """``wait_until`` with this module's default deadline."""
    return _wait_until(check, timeout_s, what, interval_s=0.05)


def postgres_bin() -> Path | None:
    """The newest PostgreSQL server binaries' directory (Debian's layout), if any."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))
    return found[-1].parent if found else None


def missing_tools() -> str | None:
    """What this deployment needs and the machine lacks, or None."""
    if postgres_bin() is None:
        return "no PostgreSQL server binaries under /usr/lib/postgresql/*/bin"
    if server_binary() is None:
        return "no redis-server"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return "no `postgres` user to run a private PostgreSQL as"
    if shutil.which("setpriv") is None:
        return "no setpriv (util-linux) to run PostgreSQL as its user"
    return None


@dataclass
class Cluster:
    """The hosts, the processes on them, and what the test reads to check them."""

    net: Network
    var: Path
    internal_token: str
    fake: FakeAnthropic
    children: dict[str, Child] = field(default_factory=dict)  # by host name
    pg_dir: Path | None = None
    prefix: str = "sbhosts:"
    _redis: redis.Redis | None = None
    _sessions: sessionmaker[Session] | None = None

    @property
    def redis_url(self) -> str:
        return f"redis://{self.net.hosts['redis'].ip}:{REDIS_PORT}/0"

    @property
    def database_url(self) -> str:
        return f"postgresql://postgres@{self.net.hosts['sql'].ip}:{PG_PORT}/signalbox"

    @property
    def keys(self) -> RedisKeys:
        return RedisKeys(self.prefix)

    @property
    def redis(self) -> redis.Redis:
        assert self._redis is not None
        return self._redis

    @property
    def sessions(self) -> sessionmaker[Session]:
        assert self._sessions is not None
        return self._sessions

    def gateway_url(self, host: str) -> str:
        return f"http://{self.net.hosts[host].ip}:{GATEWAY_PORT}"

    @property
    def proposals_url(self) -> str:
        return f"http://{self.net.hosts['proposals'].ip}:{PROPOSALS_PORT}"

    # -- the data host ---------------------------------------------------------------

    def start_redis(self) -> None:
        host = self.net.hosts["redis"]
        binary = server_binary()
        assert binary is not None
        args = [
            binary, "--port", str(REDIS_PORT), "--bind", host.ip, "--protected-mode", "no",
            "--dir", str(self.var), "--save", "", "--appendonly", "no",
            "--maxmemory-policy", "noeviction",
        ]  # fmt: skip
        self._start(host, "redis", args, dict(os.environ))
        self._redis = redis.Redis.from_url(self.redis_url, socket_timeout=5)
        wait_for(self._redis_answers, 20, "redis on its host")

    def _redis_answers(self) -> bool:
        with contextlib.suppress(redis.RedisError):
            return bool(self.redis.ping())
        return False

    def start_postgres(self) -> None:
        """A private cluster in the ``sql`` namespace: trust on the bridge, no fsync."""
        host, bin_dir = self.net.hosts["sql"], postgres_bin()
        assert bin_dir is not None
        user = pwd.getpwnam("postgres")
        # The pytest tmp dirs are root's, closed to others: the cluster gets one of its own.
        self.pg_dir = Path(tempfile.mkdtemp(prefix="sbhosts-pg-"))
        os.chown(self.pg_dir, user.pw_uid, user.pw_gid)
        as_postgres = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}"]
        as_postgres += ["--clear-groups"]
        data = self.pg_dir / "data"
        subprocess.run(
            [*as_postgres, str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres",
             "-A", "trust", "--no-sync", "-E", "UTF8"],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        args = [
            *as_postgres, str(bin_dir / "postgres"), "-D", str(data),
            "-c", f"listen_addresses={host.ip}", "-c", f"port={PG_PORT}",
            "-c", f"unix_socket_directories={self.pg_dir}", "-c", "fsync=off",
            "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
            "-c", "max_connections=400", "-c", "shared_buffers=32MB",
        ]  # fmt: skip
        with open(data / "pg_hba.conf", "a") as hba:
            hba.write(f"host all all {self.net.subnet} trust\n")
        self._start(host, "postgres", args, dict(os.environ))
        admin = f"postgresql://postgres@{host.ip}:{PG_PORT}/postgres"
        wait_for(lambda: _pg_answers(admin), 60, "postgres on its host")
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("CREATE DATABASE signalbox")
        upgrade(self.database_url)
        self._sessions = make_session_factory(make_engine(self.database_url))

    # -- the services ----------------------------------------------------------------

    def env(self, host: Host) -> dict[str, str]:
        """What every service gets (Stack.env's variables, with the hosts' addresses)."""
        return child_env(
            os.environ,
            {
                "SIGNALBOX_REDIS_URL": self.redis_url,
                "SIGNALBOX_REDIS_PREFIX": self.prefix,
                "SIGNALBOX_DATABASE_URL": self.database_url,
                "SIGNALBOX_WORKSPACES_ROOT": str(self.var / "workspaces"),
                "SIGNALBOX_INTERNAL_TOKEN": self.internal_token,
                "SIGNALBOX_PROPOSALS_URL": self.proposals_url,
                "SIGNALBOX_ALLOWED_ORIGINS": json.dumps([self.gateway_url(g) for g in GATEWAYS]),
                "SIGNALBOX_METRICS_HOST": host.ip,
                "SIGNALBOX_METRICS_PORT": str(METRICS_PORT),
                "ANTHROPIC_API_KEY": "sk-test",
                "ANTHROPIC_BASE_URL": self.fake.url,
                "SIGNALBOX_TEST_TOOLS": "1",
                # `ip netns exec` mounts a fresh /sys: no cgroups for run_python in a host.
                "SIGNALBOX_SANDBOX": "off",
                "SIGNALBOX_CATALOGUE_REFRESH_S": "1",
                "SIGNALBOX_TOOL_TIMEOUTS": json.dumps({"count_calls": TOOL_LIMIT_S}),
                "SIGNALBOX_RATE_LIMIT_PER_MINUTE": "100000",
                "SIGNALBOX_RATE_LIMIT_TURNS": "100000/minute",
                "SIGNALBOX_RATE_LIMIT_DECISIONS": "100000/minute",
            },
        )

    def _start(self, host: Host, name: str, args: list[str], env: dict[str, str]) -> Child:
        child = Child(
            name=name,
            args=host.command(args),
            log_path=self.var / "logs" / f"{host.name}-{name}.log",
            env=env,
        )
        self.children[host.name if name not in ("redis", "postgres") else name] = child
        child.start()
        return child

    def start_services(self) -> None:
        """Every service on its host, started at once; returns when all are ready."""
        (self.var / "workspaces").mkdir(parents=True, exist_ok=True)
        for name in ("proposals", *GATEWAYS, *TOOL_HOSTS, *ORCHESTRATORS):
            host = self.net.hosts[name]
            commands = ServiceCommands(
                host=host.ip, tools_concurrency=3
            )  # every call of a load at once
            env = self.env(host)
            if name in GATEWAYS:
                args = commands.gateway(GATEWAY_PORT)
                env.pop("SIGNALBOX_METRICS_PORT")  # the gateway serves /metrics itself
            elif name == "proposals":
                args = commands.proposals(PROPOSALS_PORT)
                env.pop("SIGNALBOX_METRICS_PORT")
            elif name in TOOL_HOSTS:
                args = commands.tools(f"{name}@%h")
                env.pop("PROMETHEUS_MULTIPROC_DIR", None)
            else:
                args = commands.orchestrator(f"{name}@%h")
            self._start(host, "service", args, env)
        for name in ("proposals", *GATEWAYS, *TOOL_HOSTS, *ORCHESTRATORS):
            self.children[name].wait_ready(self._ready(name), timeout_s=START_TIMEOUT_S)
        wait_for(lambda: "count_calls" in read_catalogue(self.redis, self.keys), 30, "catalogue")

    def _ready(self, name: str) -> Callable[[], bool]:
        if name in GATEWAYS:
            return http_ok(f"{self.gateway_url(name)}/healthz")
        if name == "proposals":
            return http_ok(f"{self.proposals_url}/healthz")
        return log_contains(self.children[name], " ready.")

    def log_text(self, name: str) -> str:
        child = self.children[name]
        with open(child.log_path, "rb") as log:
            log.seek(child.log_start)
            return log.read().decode(errors="replace")

    def stop(self) -> None:
        """Stop every process (services first, then the data host); never raises."""
        for child in reversed(list(self.children.values())):
            with contextlib.suppress(Exception):
                child.stop(timeout_s=5)
        if self._redis is not None:
            self._redis.close()
        if self._sessions is not None:
            bind = self._sessions.kw.get("bind")
            if bind is not None:
                bind.dispose()
        if self.pg_dir is not None:
            shutil.rmtree(self.pg_dir, ignore_errors=True)

    # -- what the checks read --------------------------------------------------------

    def new_user(self) -> str:
        """A new user's token."""
        with self.sessions() as s:
            _user, token = create_user(s, f"hosts-{uuid.uuid4().hex[:8]}")
            s.commit()
            return token

    def turn_status(self, turn_id: str) -> str:
        with self.sessions() as s:
            status = s.scalar(select(Turn.status).where(Turn.id == turn_id))
            assert status is not None, turn_id
            return status

    def stream_ids(self, conversation_id: str) -> list[str]:
        """Every event id the conversation's stream holds, in order (read from Redis)."""
        return [e.id for e in EventStream(self.redis, self.keys).read_after(conversation_id, None)]


def _pg_answers(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


@contextlib.contextmanager
def cluster(var: Path, internal_token: str) -> Iterator[Cluster]:
    """The whole deployment on its hosts; everything is removed on the way out."""
    net = Network()
    fake: FakeAnthropic | None = None
    deployed: Cluster | None = None
    try:
        net.open()
        for name in ("redis", "sql", *GATEWAYS, *ORCHESTRATORS, *TOOL_HOSTS, "proposals"):
            net.add_host(name)
        fake = FakeAnthropic(host=net.clients_ip).start()
        deployed = Cluster(net=net, var=var, internal_token=internal_token, fake=fake)
        deployed.start_redis()
        deployed.start_postgres()
        deployed.start_services()
        yield deployed
    finally:
        with contextlib.suppress(Exception):
            net.heal_all()
        if deployed is not None:
            deployed.stop()
        if fake is not None:
            fake.stop()
        net.close()


# -- clients -------------------------------------------------------------------------

PING_AFTER_S = 1.0  # a socket silent this long is pinged
DEAD_AFTER_S = 2.0  # and given up when the pong is this late


@dataclass
class Reconnect:
    """One time the client gave a gateway up and caught up on another."""

    gave_up_at: float  # monotonic
    caught_up_at: float
    gateway: str


class RoamingClient:
    """One user's WebSocket client over every gateway; a thread reads its socket."""

    def __init__(self, d: Cluster, token: str, first: int = 0) -> None:
        self.d = d
        self.token = token
        self.gateways = itertools.cycle(GATEWAYS[first:] + GATEWAYS[:first])
        self.events: dict[str, list[dict[str, Any]]] = {}  # by conversation, as received
        self.disorder: list[str] = []  # an event id not after the last one received
        self.reconnects: list[Reconnect] = []
        self._lock = threading.Lock()
        self._replies: dict[str, Future[dict[str, Any]]] = {}
        self._stop = threading.Event()
        self.gateway = ""
        self.ws: ClientConnection = self._connect()
        self._thread = threading.Thread(target=self._read, name="client", daemon=True)
        self._thread.start()

    def _connect(self) -> ClientConnection:
        name = next(self.gateways)
        url = self.d.gateway_url(name).replace("http://", "ws://") + "/ws"
        ws = connect(
            url, additional_headers={"Authorization": f"Bearer {self.token}"}, open_timeout=3
        )
        self.gateway = name
        return ws

    def request(self, frame: dict[str, Any], timeout_s: float = 15.0) -> dict[str, Any]:
        """Send ``frame``; its reply (``ack`` or ``error``)."""
        req = uuid.uuid4().hex[:8]
        reply: Future[dict[str, Any]] = Future()
        with self._lock:
            self._replies[req] = reply
        self.ws.send(json.dumps({**frame, "req": req}))
        return reply.result(timeout=timeout_s)

    def start_turn(self, text: str) -> tuple[str, str]:
        """A new conversation with one turn: (conversation id, turn id)."""
        ack = self.request({"type": "user_turn", "text": text})
        assert ack["type"] == "ack", ack
        with self._lock:
            self.events.setdefault(ack["conversation_id"], [])
        return str(ack["conversation_id"]), str(ack["turn_id"])

    def of_turn(self, turn_id: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for es in self.events.values() for e in es if e["turn_id"] == turn_id]

    def finished(self, turn_id: str) -> bool:
        return any(e["kind"] == "turn_finished" for e in self.of_turn(turn_id))

    def ids(self, conversation_id: str) -> list[str]:
        with self._lock:
            return [e["id"] for e in self.events.get(conversation_id, [])]

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(Exception):
            self.ws.close()
        self._thread.join(timeout=10)

    # -- the reader thread -----------------------------------------------------------

    def _read(self) -> None:
        pinged_at: float | None = None
        while not self._stop.is_set():
            try:
                raw = self.ws.recv(timeout=PING_AFTER_S)
            except TimeoutError:
                now = time.monotonic()
                if pinged_at is None:
                    pinged_at = now
                    with contextlib.suppress(Exception):
                        self.ws.send(json.dumps({"type": "ping"}))
                elif now - pinged_at > DEAD_AFTER_S:
                    self._roam(gave_up_at=now)
                    pinged_at = None
                continue
            except (ConnectionClosed, OSError):
                if self._stop.is_set():
                    return
                self._roam(gave_up_at=time.monotonic())
                pinged_at = None
                continue
            pinged_at = None
            self._take(json.loads(raw))

    def _take(self, frame: dict[str, Any]) -> None:
        if frame.get("type") == "event":
            conversation_id = frame["conversation_id"]
            with self._lock:
                got = self.events.setdefault(conversation_id, [])
                if got and not id_after(frame["id"], got[-1]["id"]):
                    self.disorder.append(frame["id"])
                got.append(frame)
            return
        req = frame.get("req")
        if req is not None:
            with self._lock:
                reply = self._replies.pop(req, None)
            if reply is not None:
                reply.set_result(frame)

    def _roam(self, gave_up_at: float) -> None:
        """Leave the silent gateway; resubscribe on the next one after the last ids seen."""
        with contextlib.suppress(Exception):
            self.ws.close_socket()  # no closing handshake: the peer is unreachable
        while not self._stop.is_set():
            try:
                self.ws = self._connect()
                with self._lock:
                    after = {c: (es[-1]["id"] if es else None) for c, es in self.events.items()}
                for conversation_id, last in after.items():
                    req = uuid.uuid4().hex[:8]
                    frame = {"type": "subscribe", "conversation_id": conversation_id}
                    self.ws.send(json.dumps({**frame, "after": last, "req": req}))
                    while True:  # the ack comes first, then the stored events after ``last``
                        reply = json.loads(self.ws.recv(timeout=5))
                        self._take(reply)
                        if reply.get("req") == req:
                            assert reply["type"] == "ack", reply
                            break
            except (OSError, TimeoutError, ConnectionClosed):
                continue  # that gateway is unreachable too: the next one
            self.reconnects.append(Reconnect(gave_up_at, time.monotonic(), self.gateway))
            return
