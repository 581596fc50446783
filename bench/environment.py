"""Everything a benchmark run needs, started by the run itself and stopped at its end.

Its own ``redis-server`` on a free port, a fresh SQLite database, the fake Messages API
(``tests.fake_anthropic``), and the Signalbox services as real processes through
``signalbox.stack.Stack``; tool workers (and the bare Celery workers of the baselines) are
started and replaced as each benchmark asks for a different number of them.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from sqlalchemy.orm import Session, sessionmaker

from bench.machine import REPO, Machine, describe, raise_fd_limit
from bench.noop_app import NOOP_QUEUE
from signalbox.processes import (
    Child,
    Launch,
    ServiceCommands,
    log_contains,
    python_module,
    start_together,
    stop_together,
)
from signalbox.redis_server import RedisServer, free_port, start_redis
from signalbox.shared.celery_app import make_celery
from signalbox.shared.db import make_engine, make_session_factory
from signalbox.shared.db.migrate import upgrade
from signalbox.shared.db.users import create_user
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.settings import CommonSettings
from signalbox.shared.tool_contract import read_catalogue
from signalbox.stack import Stack, StackConfig
from tests.fake_anthropic import FakeAnthropic

FD_LIMIT_WANTED = 65_536  # 2,000 sockets on each side of the connections benchmark, and more
PREFIX = "bench:"
DUMMY_API_KEY = "sk-bench-not-a-real-key"  # the fake Messages API accepts anything
CATALOGUE_WAIT_S = 30.0


@dataclass
class Pool:
    """A set of worker processes of one kind, all with the same concurrency."""

    processes: int
    concurrency: int
    children: list[Child] = field(default_factory=list)

    @property
    def pids(self) -> list[int]:
        """The main process of each worker."""
        return [c.pid for c in self.children]


@dataclass
class BenchEnv:
    """One private Signalbox deployment for one benchmark run."""

    var_dir: Path
    redis_server: RedisServer
    database_url: str
    fake: FakeAnthropic
    stack: Stack
    keys: RedisKeys
    redis: redis.Redis
    sessions: sessionmaker[Session]
    fd_limit: int
    keep_var: bool = False
    drop_database: str | None = None  # the PostgreSQL database this run made: "server|name"
    tools_pool: Pool | None = None
    noop_pool: Pool | None = None
    extra_children: list[Child] = field(default_factory=list)
    _machine: Machine | None = None

    # -- start and stop --------------------------------------------------------------------

    @classmethod
    def start(cls, var_dir: Path | None = None, postgres: str | None = None) -> BenchEnv:
        """Start Redis, migrate a fresh database and start the fake model server.

        ``postgres``: a PostgreSQL server's URL; the run gets a database of its own there
        (dropped at ``stop``) instead of a SQLite file."""
        fd_limit = raise_fd_limit(FD_LIMIT_WANTED)  # before any child: they inherit it
        keep = var_dir is not None
        var = var_dir or Path(tempfile.mkdtemp(prefix="signalbox-bench-"))
        var.mkdir(parents=True, exist_ok=True)
        server = start_redis(var / "redis", persistent=False)
        drop_database: str | None = None
        if postgres:
            database_url, drop_database = _fresh_postgres(postgres)
        else:
            database_url = f"sqlite:///{var / 'signalbox.db'}"
        upgrade(database_url)
        fake = FakeAnthropic(split_chunks=False).start()
        config = StackConfig(
            var_dir=var,
            redis_url=server.url,
            database_url=database_url,
            internal_token=secrets.token_urlsafe(24),
            redis_prefix=PREFIX,
            orchestrators=0,
            tools_workers=0,
            extra_env={
                "ANTHROPIC_API_KEY": DUMMY_API_KEY,
                "ANTHROPIC_BASE_URL": fake.url,
                "SIGNALBOX_TEST_TOOLS": "1",
                # One bench user sends far more frames than a person would.
                "SIGNALBOX_RATE_LIMIT_PER_MINUTE": "100000000",
                "SIGNALBOX_RATE_LIMIT_TURNS": "100000000/minute",
                "SIGNALBOX_RATE_LIMIT_DECISIONS": "100000000/minute",
                "SIGNALBOX_RATE_LIMIT_WRITES": "100000000/minute",  # conversations (fairness)
                "PYTHONPATH": str(REPO),
            },
        )
        stack = Stack(config)
        config.workspaces_root.mkdir(parents=True, exist_ok=True)
        return cls(
            var_dir=var,
            redis_server=server,
            database_url=database_url,
            fake=fake,
            stack=stack,
            keys=RedisKeys(PREFIX),
            redis=redis.Redis.from_url(server.url),
            sessions=make_session_factory(make_engine(database_url)),
            fd_limit=fd_limit,
            keep_var=keep,
            drop_database=drop_database,
        )

    @property
    def on_postgres(self) -> bool:
        """Whether this run's database is PostgreSQL (else a SQLite file)."""
        return self.database_url.startswith("postgresql")

    def stop(self) -> None:
        """Stop every process this run started and remove its files (unless kept)."""
        self.stop_tools()
        self.stop_noop()
        for child in self.extra_children:
            child.stop()
        self.extra_children.clear()
        self.stack.stop()
        self.fake.stop()
        self.redis.close()
        self.redis_server.stop()
        if not self.keep_var:
            shutil.rmtree(self.var_dir, ignore_errors=True)
        if self.drop_database is not None:
            _drop_postgres(self.drop_database)

    def __enter__(self) -> BenchEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def machine(self) -> Machine:
        """The machine, Redis and commit of this run."""
        if self._machine is None:
            self._machine = describe(self.redis_server.url)
        return self._machine

    # -- the services ----------------------------------------------------------------------

    @property
    def redis_url(self) -> str:
        """The run's own Redis."""
        return self.redis_server.url

    def env(self, **overrides: str) -> dict[str, str]:
        """The environment of a service of this deployment."""
        env = self.stack.env()
        env.update(overrides)
        return env

    def gateway(self) -> Child:
        """The gateway, started on first use."""
        child = self.stack.children.get("gateway")
        return child if child is not None else self.stack.start_gateway()

    def orchestrator(self) -> Child:
        """One orchestrator worker, started on first use."""
        child = self.stack.children.get("orchestrator1")
        return child if child is not None else self.stack.start_orchestrator("orchestrator1")

    def extra_gateway(self, name: str, **overrides: str) -> tuple[Child, str]:
        """Another gateway process with its own settings; returns it and its base URL."""
        port = free_port()
        child = Child(
            name=name,
            args=ServiceCommands().gateway(port),
            log_path=self.var_dir / "logs" / f"{name}.log",
            env=self.env(**overrides),
        )
        self.extra_children.append(child)
        child.start()
        url = f"http://127.0.0.1:{port}"
        from signalbox.processes import http_ok

        child.wait_ready(http_ok(f"{url}/healthz"))
        return child, url

    def stop_extra(self, child: Child) -> None:
        """Stop a process started by ``extra_gateway``."""
        child.stop()
        with contextlib.suppress(ValueError):
            self.extra_children.remove(child)

    def tools(self, processes: int, concurrency: int) -> Pool:
        """Exactly ``processes`` tool workers of ``concurrency`` prefork slots each."""
        pool = self.tools_pool
        if pool is not None and (pool.processes, pool.concurrency) == (processes, concurrency):
            return pool
        self.stop_tools()
        pool = Pool(processes, concurrency)
        self.tools_pool = pool
        self.stack.commands.tools_concurrency = concurrency
        names = [f"tools{i + 1}" for i in range(processes)]
        self.stack.start_tools_workers(names, queues="tools")
        pool.children.extend(self.stack.children[name] for name in names)
        self._wait_catalogue(processes)
        return pool

    def _wait_catalogue(self, workers: int) -> None:
        deadline = time.monotonic() + CATALOGUE_WAIT_S
        while time.monotonic() < deadline:
            live = self.redis.zcard(self.keys.tool_catalogue())
            if live >= workers and "sleep" in read_catalogue(self.redis, self.keys):
                return
            time.sleep(0.05)  # another process's start-up: polled, with a deadline
        raise RuntimeError(f"{workers} tool workers did not publish their catalogue")

    def stop_tools(self) -> None:
        """Stop the tool workers (they withdraw their catalogue)."""
        if self.tools_pool is None:
            return
        for child in self.tools_pool.children:
            self.stack.children.pop(child.name, None)
        stop_together(self.tools_pool.children)
        self.tools_pool = None

    def noop_workers(self, processes: int, concurrency: int) -> Pool:
        """Exactly ``processes`` bare Celery workers (prefork, ``concurrency`` slots each)."""
        pool = self.noop_pool
        if pool is not None and (pool.processes, pool.concurrency) == (processes, concurrency):
            return pool
        self.stop_noop()
        pool = Pool(processes, concurrency)
        self.noop_pool = pool
        launches = []
        for i in range(processes):
            name = f"noop{i + 1}"
            args = python_module(
                "celery", "-A", "bench.noop_app:app", "worker",
                "-Q", NOOP_QUEUE, "--pool", "prefork", "-c", str(concurrency),
                "-n", f"{name}@%h", "--without-gossip", "--without-mingle", "--loglevel", "INFO",
            )  # fmt: skip
            child = Child(name, args, self.var_dir / "logs" / f"{name}.log", self.env())
            pool.children.append(child)
            launches.append(Launch(child, log_contains(child, " ready.")))
        start_together(launches)  # started at once; stop_noop stops them on a failure too
        return pool

    def stop_noop(self) -> None:
        """Stop the bare Celery workers."""
        if self.noop_pool is None:
            return
        stop_together(self.noop_pool.children)
        self.noop_pool = None

    # -- clients ---------------------------------------------------------------------------

    def celery(self, name: str = "bench-client") -> Celery:
        """A Celery client on this deployment's Redis, with Signalbox's delivery settings."""
        settings = CommonSettings(redis_url=self.redis_url, redis_prefix=PREFIX)
        return make_celery(name, settings)

    def user(self) -> tuple[str, str]:
        """A new user and its API token."""
        with self.sessions() as session:
            user, token = create_user(session, f"bench-{uuid.uuid4().hex[:8]}")
            session.commit()
            return user.id, token

    def settings_kwargs(self) -> dict[str, Any]:
        """What an in-process service's settings need to reach this deployment."""
        return {
            "redis_url": self.redis_url,
            "redis_prefix": PREFIX,
            "database_url": self.database_url,
            "workspaces_root": self.stack.config.workspaces_root,
        }


def proc_status_kib(pid: int, field_name: str = "VmRSS") -> int:
    """A ``/proc/<pid>/status`` figure in KiB (resident memory by default)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise LookupError(f"no {field_name!r} in /proc/{pid}/status")


def proc_cpu_s(pid: int) -> float:
    """User plus system CPU seconds of ``pid`` so far, from ``/proc/<pid>/stat``."""
    fields = _stat_fields(pid)
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return ticks / os.sysconf("SC_CLK_TCK")


def _children_of(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            found.extend(int(c) for c in (task / "children").read_text().split())
    except OSError:
        pass
    return found


def proc_tree_cpu_s(pids: list[int]) -> float:
    """CPU seconds of ``pids`` and all their descendants (a prefork worker and its pool),
    those that have ended included: a process's ``cutime``/``cstime`` hold its children's
    once it has waited for them, so a pool process replaced between two readings, or a
    PostgreSQL backend that closed, still counts in the difference."""
    total = 0.0
    stack = list(pids)
    while stack:
        pid = stack.pop()
        try:
            total += _cpu_with_reaped_children_s(pid)
        except OSError:
            continue  # it ended between listing and reading
        stack.extend(_children_of(pid))
    return total


POSTGRES_PROCESS = "postgres"  # the server's processes' name in /proc/<pid>/comm
LOOPBACK_HOSTS = frozenset({"", "localhost", "127.0.0.1", "::1"})  # "": a Unix socket


def postgres_server_cpu_s(database_url: str) -> float | None:
    """CPU seconds so far of the PostgreSQL server that ``database_url`` names, when it runs
    on this machine: its postmaster with every backend and background process, the ones that
    have exited included (a parent's ``cutime``/``cstime``, which a process's own figure
    lacks). ``None`` for SQLite, a server elsewhere, or one whose processes this user cannot
    read.

    The server serves every database on it, so this is the server's whole CPU: the run's own
    database is the only busy one on a bench machine. SQLite's work is done inside the
    services' processes and counted there; this puts PostgreSQL's beside it.
    """
    from sqlalchemy import text

    engine = make_engine(database_url)
    try:
        if engine.dialect.name != "postgresql" or (engine.url.host or "") not in LOOPBACK_HOSTS:
            return None
        with engine.connect() as conn:  # the backend ends with its connection: ask it now
            backend = int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
            postmaster = _parent_of(backend)
    finally:
        engine.dispose()
    if postmaster is None or not _named(postmaster, POSTGRES_PROCESS):
        return None  # not this machine's server: a pid here that happens to match
    return proc_tree_cpu_s([postmaster])


def _stat_fields(pid: int) -> list[str]:
    """``/proc/<pid>/stat`` after the command name: field 3 (the state) first."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    return raw[raw.rindex(")") + 2 :].split()


def _parent_of(pid: int) -> int | None:
    try:
        return int(_stat_fields(pid)[1])
    except OSError:
        return None


def _named(pid: int, name: str) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == name
    except OSError:
        return False


def _cpu_with_reaped_children_s(pid: int) -> float:
    """User and system CPU of ``pid`` and of its children that have ended and been waited
    for (utime, stime, cutime, cstime: fields 14 to 17 of stat)."""
    fields = _stat_fields(pid)
    ticks = sum(int(f) for f in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


def _fresh_postgres(server_url: str) -> tuple[str, str]:
    """A new, empty database on the PostgreSQL server at ``server_url``: (its URL, what
    ``_drop_postgres`` needs to drop it)."""
    from sqlalchemy import create_engine, text

    name = f"sbbench_{uuid.uuid4().hex[:10]}"
    server = make_engine(server_url).url
    plain = server.render_as_string(hide_password=False)
    admin = create_engine(plain, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    fresh = server.set(database=name).render_as_string(hide_password=False)
    return fresh, f"{plain}|{name}"


def _drop_postgres(handle: str) -> None:
    from sqlalchemy import create_engine, text

    server, name = handle.rsplit("|", 1)
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()
