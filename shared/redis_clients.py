"""Every Redis client of every service is made here, from ``SIGNALBOX_REDIS_URL``.

Two forms of the URL:

- ``redis://[[user]:password@]host:port/db``: one Redis, exactly as redis-py, kombu and
  Celery read it (the fast path; nothing here changes how it connects).
- ``redis+sentinel://[[user]:password@]host1:26379,host2:26379,host3:26379/MASTER/db``
  (optional ``?sentinel_password=...``): Redis Sentinel. Each connection first asks the
  sentinels where the master named ``MASTER`` is now; after a failover a broken connection
  is retried (``FAILOVER_RETRY``, longer than a failover takes) and reconnects to the new
  master. The credentials are the data nodes'; ``sentinel_password`` the sentinels' own.

Besides the redis-py clients (sync and asyncio), the same URL configures Celery's broker and
result backend (kombu's ``sentinel://`` transport, ``celery_broker``) and RedBeat
(``redbeat_config``); the gateway's rate limits run on its asyncio pool, so they follow too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import redis
import redis.asyncio as aioredis
import redis.asyncio.sentinel as async_sentinel
import redis.exceptions
import redis.sentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

SENTINEL_SCHEME = "redis+sentinel"
DEFAULT_SENTINEL_PORT = 26379
# A sentinel that does not answer within this is skipped for the next one.
SENTINEL_TIMEOUT_S = 0.5
# How long a command keeps retrying on a broken connection: a failover takes the sentinels'
# ``down-after-milliseconds`` plus an election (seconds), and the master is unknown (or
# still the dead one) until it ends. 0.05, 0.1, ... capped at 1 s: about 15 s in all.
FAILOVER_RETRIES = 20
REDBEAT_SOCKET_TIMEOUT_S = 5.0
_FAILOVER_ERRORS: list[type[Exception]] = [
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
]


def _failover_backoff() -> ExponentialBackoff:
    return ExponentialBackoff(cap=1.0, base=0.05)


@dataclass(frozen=True)
class SentinelTarget:
    """Where a ``redis+sentinel://`` URL points: the sentinels, the master's name, the db."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None

    def node_kwargs(self) -> dict[str, Any]:
        """Connection arguments of the data nodes (master and replicas)."""
        kwargs: dict[str, Any] = {"db": self.db}
        if self.username:
            kwargs["username"] = self.username
        if self.password:
            kwargs["password"] = self.password
        return kwargs

    def sentinel_kwargs(self) -> dict[str, Any]:
        """Connection arguments of the sentinels themselves."""
        kwargs: dict[str, Any] = {
            "socket_timeout": SENTINEL_TIMEOUT_S,
            "socket_connect_timeout": SENTINEL_TIMEOUT_S,
        }
        if self.sentinel_password:
            kwargs["password"] = self.sentinel_password
        return kwargs


def sentinel_target(url: str) -> SentinelTarget | None:
    """The sentinels of a ``redis+sentinel://`` URL; None for any other URL."""
    parts = urlsplit(url)
    if parts.scheme != SENTINEL_SCHEME:
        return None
    hosts = parts.netloc.rpartition("@")[2]
    sentinels = tuple(_host_port(hp, url) for hp in hosts.split(",") if hp)
    path = [p for p in parts.path.split("/") if p]
    if not sentinels or not path or len(path) > 2:
        raise ValueError(
            "expected redis+sentinel://host:port[,host:port...]/MASTER[/db], "
            f"got {_redacted(url)!r}"
        )
    try:
        db = int(path[1]) if len(path) == 2 else 0
    except ValueError:
        raise ValueError(f"expected a database number after the master, got {path[1]!r}") from None
    query = parse_qs(parts.query)
    sentinel_password = query.get("sentinel_password", [None])[-1]
    return SentinelTarget(
        sentinels=sentinels,
        master=unquote(path[0]),
        db=db,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
        sentinel_password=sentinel_password,
    )


def _host_port(text: str, url: str) -> tuple[str, int]:
    if text.startswith("["):  # [IPv6]:port
        host, _, rest = text[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        host, _, port = text.partition(":")
    if not host or (port and not port.isdigit()):
        raise ValueError(f"expected host:port in {_redacted(url)!r}, got {text!r}")
    return host, int(port) if port else DEFAULT_SENTINEL_PORT


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return url.replace(f":{parts.password}@", ":***@", 1)


def is_sentinel(url: str) -> bool:
    """True when ``url`` names Redis through Sentinel."""
    return urlsplit(url).scheme == SENTINEL_SCHEME


# -- redis-py ------------------------------------------------------------------------------


def _with_failover_retry(kw: dict[str, Any], retry: Retry | AsyncRetry) -> dict[str, Any]:
    if "retry" in kw:  # the caller chose (a signal handler's check wants none)
        return kw
    return {"retry": retry, "retry_on_error": _FAILOVER_ERRORS, **kw}


class _SyncSentinelConnection(redis.sentinel.SentinelManagedConnection):
    """redis-py's sentinel connection, except that EVERY connect asks the sentinels first.

    redis-py 8 (re)connects a connection that is not connected, on its next command, through
    ``connect_check_health``, which skips the sentinel lookup: a connection dropped by the
    failover retries the dead master's address until its retries run out, and a connection
    made by ``make_connection()`` and used at once (the gateway's relay readers) dials the
    default ``localhost:6379``, whatever answers there.
    """

    def connect_check_health(
        self, check_health: bool = True, retry_socket_connect: bool = True
    ) -> None:
        if not self.is_connected and self.connection_pool.is_master:
            self.host, self.port = self.connection_pool.get_master_address()
        super().connect_check_health(check_health, retry_socket_connect)


class _AsyncSentinelConnection(async_sentinel.SentinelManagedConnection):
    """The asyncio twin of ``_SyncSentinelConnection`` (the same redis-py 8 gap)."""

    async def connect_check_health(
        self, check_health: bool = True, retry_socket_connect: bool = True
    ) -> None:
        if not self.is_connected and self.connection_pool.is_master:
            self.host, self.port = await self.connection_pool.get_master_address()
        await super().connect_check_health(check_health, retry_socket_connect)


def sync_client(url: str, **kw: Any) -> redis.Redis:
    """A redis-py client of the deployment's Redis (``kw``: redis-py's own arguments)."""
    target = sentinel_target(url)
    if target is None:
        return redis.Redis.from_url(url, **kw)
    manager = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
        list(target.sentinels), sentinel_kwargs=target.sentinel_kwargs()
    )
    kwargs = _with_failover_retry(kw, Retry(_failover_backoff(), FAILOVER_RETRIES))
    client: redis.Redis = manager.master_for(  # type: ignore[no-untyped-call]
        target.master, connection_class=_SyncSentinelConnection, **target.node_kwargs(), **kwargs
    )
    return client


class _BlockingSentinelPool(async_sentinel.SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """Sentinel's master lookup with the blocking pool's wait for a free connection."""


def async_pool(url: str, *, blocking: bool = False, **kw: Any) -> aioredis.ConnectionPool:
    """An asyncio connection pool (``blocking``: a full pool waits ``timeout`` s for a free
    connection instead of raising)."""
    target = sentinel_target(url)
    if target is None:
        cls = aioredis.BlockingConnectionPool if blocking else aioredis.ConnectionPool
        return cls.from_url(url, **kw)
    manager = async_sentinel.Sentinel(  # type: ignore[no-untyped-call]
        list(target.sentinels), sentinel_kwargs=target.sentinel_kwargs()
    )
    kwargs = _with_failover_retry(kw, AsyncRetry(_failover_backoff(), FAILOVER_RETRIES))
    pool_class = _BlockingSentinelPool if blocking else async_sentinel.SentinelConnectionPool
    return pool_class(  # type: ignore[no-untyped-call]
        target.master,
        manager,
        is_master=True,
        connection_class=_AsyncSentinelConnection,
        **target.node_kwargs(),
        **kwargs,
    )


def async_client(url: str, *, blocking: bool = False, **kw: Any) -> aioredis.Redis:
    """An asyncio client of the deployment's Redis, owning its own pool (``async_pool``)."""
    if sentinel_target(url) is None and not blocking:
        return aioredis.Redis.from_url(url, **kw)
    return aioredis.Redis.from_pool(async_pool(url, blocking=blocking, **kw))


# -- Celery, kombu, RedBeat ------------------------------------------------------------------


def celery_broker(url: str) -> tuple[str, dict[str, Any]]:
    """Celery's broker/backend URL for ``url`` and the transport options it needs on top.

    Sentinel: kombu's and Celery's ``sentinel://h1:p1;sentinel://h2:p2/db`` (every sentinel
    is tried), with the master's name (and the sentinels' password) as transport options.
    """
    target = sentinel_target(url)
    if target is None:
        return url, {}
    auth = ""
    if target.password:
        user = quote(target.username or "", safe="")
        auth = f"{user}:{quote(target.password, safe='')}@"
    broker = ";".join(
        f"sentinel://{auth}{_netloc(host, port)}/{target.db}" for host, port in target.sentinels
    )
    options: dict[str, Any] = {
        "master_name": target.master,
        "sentinel_kwargs": target.sentinel_kwargs(),
    }
    return broker, options


def _netloc(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def redbeat_config(url: str) -> dict[str, Any]:
    """RedBeat's settings for ``url`` (``redbeat_redis_url`` and, for Sentinel, its
    ``redbeat_redis_options``)."""
    target = sentinel_target(url)
    if target is None:
        return {"redbeat_redis_url": url}
    options: dict[str, Any] = {
        "sentinels": [list(s) for s in target.sentinels],
        "service_name": target.master,
        "db": target.db,
        "socket_timeout": REDBEAT_SOCKET_TIMEOUT_S,  # of the sentinels and the master alike
        # RedBeat retries a beat tick's Redis commands for this long (seconds), then gives up
        # the tick: longer than a failover.
        "retry_period": 30,
    }
    if target.password:
        options["password"] = target.password
    if target.sentinel_password:
        options["sentinel_kwargs"] = {"password": target.sentinel_password}
    return {"redbeat_redis_url": "redis-sentinel://", "redbeat_redis_options": options}
