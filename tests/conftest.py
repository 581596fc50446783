"""Fixtures every test folder shares: a real Redis, a real SQL database, users, a whole stack.

``SIGNALBOX_REDIS_URL`` / ``SIGNALBOX_DATABASE_URL`` are honoured; when unset the tests
start their own Redis and use a SQLite file. Each run gets its own Redis key prefix (and
its own PostgreSQL database), so parallel runs never collide.
"""

from __future__ import annotations

import os
import secrets
import ssl
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx._transports.default as _httpx_transport
import pytest
import redis
from sqlalchemy.orm import Session, sessionmaker

from signalbox.redis_server import find_or_start_redis
from signalbox.shared.db import make_engine, make_session_factory
from signalbox.shared.db.users import create_user
from signalbox.shared.redis_keys import RedisKeys
from signalbox.stack import Stack, StackConfig
from tests.databases import own_database
from tests.fake_anthropic import FakeAnthropic

# httpx builds a TLS context for every client it makes, even one that only ever speaks plain
# HTTP to 127.0.0.1: 0.1 to 0.3 s of CPU each with this machine's OpenSSL 3, and the tests
# make thousands (``httpx.get`` makes a client per call). Clients asking for the default
# verification share one context here, in the test process only (a context is only read once
# built, so sharing is safe); the services build theirs once per process anyway.
_build_ssl_context = _httpx_transport.create_ssl_context  # type: ignore[attr-defined]
_shared_ssl_contexts: dict[bool, ssl.SSLContext] = {}


def _shared_ssl_context(
    verify: ssl.SSLContext | str | bool = True, cert: Any = None, trust_env: bool = True
) -> ssl.SSLContext:
    if verify is not True or cert is not None:
        return _build_ssl_context(verify=verify, cert=cert, trust_env=trust_env)
    if trust_env not in _shared_ssl_contexts:
        _shared_ssl_contexts[trust_env] = _build_ssl_context(trust_env=trust_env)
    return _shared_ssl_contexts[trust_env]


_httpx_transport.create_ssl_context = _shared_ssl_context  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def run_id() -> str:
    return uuid.uuid4().hex[:10]


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = find_or_start_redis(
        os.environ.get("SIGNALBOX_REDIS_URL"), tmp_path_factory.mktemp("redis"), persistent=False
    )
    yield server.url
    server.stop()


@pytest.fixture(scope="session")
def redis_prefix(run_id: str) -> str:
    return f"sbtest-{run_id}:"


@pytest.fixture(scope="session")
def keys(redis_prefix: str) -> RedisKeys:
    return RedisKeys(redis_prefix)


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def channelless_redis_url(redis_url: str, redis_client: redis.Redis) -> Iterator[str]:
    """``redis_url`` as a user allowed every key and command but no pub/sub channel (Redis
    ACL); the user is deleted after the test."""
    user, password = f"sb-nochannels-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    redis_client.acl_setuser(
        user, enabled=True, passwords=[f"+{password}"], keys=["*"], commands=["+@all"],
        reset_channels=True,
    )  # fmt: skip
    scheme, rest = redis_url.split("://", 1)
    try:
        yield f"{scheme}://{user}:{password}@{rest}"
    finally:
        redis_client.acl_deluser(user)


def _database(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[str]:
    """A migrated database of its own: in the given PostgreSQL server, else a SQLite file."""
    with own_database(tmp_path_factory.mktemp(name), name) as url:
        yield url


@pytest.fixture(scope="session")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _database(tmp_path_factory, "test")


@pytest.fixture(scope="session")
def db_sessions(database_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(database_url)
    yield make_session_factory(engine)
    engine.dispose()


@pytest.fixture(scope="session")
def stack_database_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The shared ``stack``'s own database: its proposals sweeper relays every unsent outbox
    row it finds, so it must not see the rows other tests leave unsent on purpose."""
    yield from _database(tmp_path_factory, "stack")


@pytest.fixture(scope="session")
def stack_sessions(stack_database_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(stack_database_url)
    yield make_session_factory(engine)
    engine.dispose()


@pytest.fixture(scope="session")
def internal_token() -> str:
    return secrets.token_urlsafe(24)


def _user_factory(sessions: sessionmaker[Session]) -> Callable[[], tuple[str, str]]:
    def make() -> tuple[str, str]:
        with sessions() as session:
            user, token = create_user(session, f"user-{uuid.uuid4().hex[:8]}")
            session.commit()
            return user.id, token

    return make


@pytest.fixture
def make_user(db_sessions: sessionmaker[Session]) -> Callable[[], tuple[str, str]]:
    """A factory: each call creates a user and returns ``(user_id, token)``."""
    return _user_factory(db_sessions)


@pytest.fixture
def make_stack_user(stack_sessions: sessionmaker[Session]) -> Callable[[], tuple[str, str]]:
    """Like ``make_user``, in the database of the shared ``stack``."""
    return _user_factory(stack_sessions)


@pytest.fixture
def service_env(
    monkeypatch: pytest.MonkeyPatch,
    redis_url: str,
    redis_prefix: str,
    database_url: str,
    internal_token: str,
    tmp_path: Path,
) -> dict[str, str]:
    """Set the ``SIGNALBOX_*`` variables for an in-process service under test."""
    env = {
        "SIGNALBOX_REDIS_URL": redis_url,
        "SIGNALBOX_REDIS_PREFIX": redis_prefix,
        "SIGNALBOX_DATABASE_URL": database_url,
        "SIGNALBOX_WORKSPACES_ROOT": str(tmp_path / "workspaces"),
        "SIGNALBOX_INTERNAL_TOKEN": internal_token,
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    return env


@pytest.fixture(scope="session")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
    redis_url: str,
    redis_prefix: str,
    stack_database_url: str,
    internal_token: str,
) -> Iterator[Stack]:
    """Every service as a real process (demo model), shared by the end-to-end tests."""
    config = StackConfig(
        var_dir=tmp_path_factory.mktemp("stack"),
        redis_url=redis_url,
        database_url=stack_database_url,
        internal_token=internal_token,
        redis_prefix=redis_prefix + "stack:",
        extra_env={"ANTHROPIC_API_KEY": ""},
    )
    s = Stack(config)
    s.start()
    yield s
    s.stop()


@pytest.fixture
def fake_anthropic() -> Iterator[FakeAnthropic]:
    """A running fake Messages API server, scripted by the test."""
    with FakeAnthropic() as server:
        yield server
