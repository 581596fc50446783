"""Redis clients made by ``shared/redis_clients.py``: the URL forms, and every kind of client
(sync, asyncio, blocking pool, Celery's broker and backend, RedBeat, the rate limits)
following a real Sentinel failover to the new master."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from limits import parse
from limits.aio.storage import RedisStorage
from limits.aio.strategies import MovingWindowRateLimiter
from redbeat.schedulers import get_redis

from signalbox.processes import wait_until
from signalbox.shared.celery_app import make_celery
from signalbox.shared.redis_clients import (
    DEFAULT_SENTINEL_PORT,
    SentinelTarget,
    async_client,
    async_pool,
    celery_broker,
    redbeat_config,
    sentinel_target,
    sync_client,
)
from signalbox.shared.settings import CommonSettings
from tests.sentinel_cluster import MASTER_NAME, SentinelCluster, start_sentinel_cluster

FAILOVER_WAIT_S = 60.0


def test_a_plain_url_is_left_to_redis_py_as_it_is() -> None:
    url = "redis://:pw@127.0.0.1:6390/3"
    assert sentinel_target(url) is None
    assert celery_broker(url) == (url, {})
    assert redbeat_config(url) == {"redbeat_redis_url": url}
    client = sync_client(url)
    kwargs = client.connection_pool.connection_kwargs
    assert (kwargs["port"], kwargs["db"], kwargs["password"]) == (6390, 3, "pw")


def test_a_sentinel_url_names_the_sentinels_the_master_and_the_db() -> None:
    target = sentinel_target(
        "redis+sentinel://u:p%40ss@s1:26380,s2,[::1]:26381/my-master/2?sentinel_password=sp"
    )
    assert target == SentinelTarget(
        sentinels=(("s1", 26380), ("s2", DEFAULT_SENTINEL_PORT), ("::1", 26381)),
        master="my-master",
        db=2,
        username="u",
        password="p@ss",
        sentinel_password="sp",
    )
    broker, options = celery_broker("redis+sentinel://:pw@s1:26380,s2:26381/mm/1")
    assert broker == "sentinel://:pw@s1:26380/1;sentinel://:pw@s2:26381/1"
    assert options["master_name"] == "mm"
    redbeat = redbeat_config("redis+sentinel://:pw@s1:26380,s2:26381/mm/1")
    assert redbeat["redbeat_redis_url"] == "redis-sentinel://"
    assert redbeat["redbeat_redis_options"]["sentinels"] == [["s1", 26380], ["s2", 26381]]
    assert redbeat["redbeat_redis_options"]["service_name"] == "mm"


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://s1:26379",  # no master
        "redis+sentinel://s1:26379/m/0/x",
        "redis+sentinel://s1:26379/m/zero",
        "redis+sentinel://s1:port/m",
        "redis+sentinel://:secret@/m",  # no sentinel
    ],
)
def test_a_malformed_sentinel_url_is_refused_without_its_password(url: str) -> None:
    with pytest.raises(ValueError) as refused:
        sentinel_target(url)
    assert "secret" not in str(refused.value)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelCluster]:
    cluster = start_sentinel_cluster(tmp_path_factory.mktemp("sentinel"))
    yield cluster
    cluster.stop()


def _fail_over(cluster: SentinelCluster) -> int:
    """Ask a sentinel for a failover (the master is demoted, not killed); the new port."""
    old = cluster.master_port()
    assert old is not None
    cluster.wait_in_sync()
    sentinel = redis.Redis(port=cluster.sentinels[0].port, socket_timeout=5)
    try:
        sentinel.execute_command("SENTINEL", "FAILOVER", MASTER_NAME)  # type: ignore[no-untyped-call]
    finally:
        sentinel.close()
    port: int = wait_until(lambda: cluster.promoted(old) or 0, FAILOVER_WAIT_S, "a promoted master")
    # Until the sentinels demote it, the old master still takes writes that its resync from
    # the new one then drops (docs/operations.md): the clients are tested after that.
    wait_until(lambda: _role(old) == "slave", FAILOVER_WAIT_S, "the old master demoted")
    return port


def _role(port: int) -> str:
    client = redis.Redis(port=port, decode_responses=True, socket_timeout=2)
    try:
        return str(client.role()[0])
    finally:
        client.close()


def test_sync_and_asyncio_clients_follow_a_failover_to_the_new_master(
    cluster: SentinelCluster,
) -> None:
    key = f"failover-{uuid.uuid4().hex[:8]}"
    sync = sync_client(cluster.url)
    sync.set(key, "before")

    async def run() -> tuple[Any, Any, Any]:
        plain = async_client(cluster.url, decode_responses=True)
        blocking = async_client(
            cluster.url, blocking=True, decode_responses=True, max_connections=4, timeout=5
        )
        await plain.set(f"{key}:a", "before")
        await blocking.set(f"{key}:b", "before")
        new_port = await asyncio.to_thread(_fail_over, cluster)
        # The same clients, their pooled connections to the demoted master now read-only.
        await plain.set(f"{key}:a", "after")
        await blocking.set(f"{key}:b", "after")
        assert _role(new_port) == "master"
        try:
            return await plain.get(f"{key}:a"), await blocking.get(f"{key}:b"), None
        finally:
            await plain.aclose()
            await blocking.aclose()

    a, b, _ = asyncio.run(run())
    sync.set(key, "after")
    direct = redis.Redis(port=cluster.master_port() or 0, decode_responses=True)
    try:
        assert direct.get(key) == "after" and (a, b) == ("after", "after")
        assert direct.get(f"{key}:a") == "after"
    finally:
        direct.close()
        sync.close()


def test_celery_redbeat_and_the_rate_limits_work_through_sentinel(
    cluster: SentinelCluster, tmp_path: Path
) -> None:
    prefix = f"sbs-{uuid.uuid4().hex[:6]}:"
    app = make_celery("sentinel-test", CommonSettings(redis_url=cluster.url, redis_prefix=prefix))
    app.conf.update(**redbeat_config(cluster.url))
    try:
        for round_ in ("before", "after"):
            if round_ == "after":
                _fail_over(cluster)
            app.send_task("tools.nothing", args=[round_], queue="sentinel-test")
            app.backend.store_result(f"task-{round_}", {"round": round_}, "SUCCESS")
            master = redis.Redis(port=cluster.master_port() or 0)
            try:
                # The message reached the (new) master's queue list, under the prefix.
                assert master.llen(f"{prefix}sentinel-test") >= 1
            finally:
                master.close()
            assert app.backend.get_task_meta(f"task-{round_}")["result"] == {"round": round_}
            beat = get_redis(app)
            assert beat.set(f"{prefix}redbeat:probe", round_) and beat.get(
                f"{prefix}redbeat:probe"
            ) in (round_, round_.encode())
            _a_rate_limit_counts(cluster.url, prefix)
    finally:
        app.close()


def _a_rate_limit_counts(url: str, prefix: str) -> None:
    async def run() -> None:
        pool = async_pool(url, blocking=True, decode_responses=True, max_connections=4)
        storage = RedisStorage(
            "async+redis://",
            implementation="redispy",
            key_prefix=f"{prefix}limits",
            connection_pool=pool,  # type: ignore[arg-type]
        )
        limiter = MovingWindowRateLimiter(storage)
        item = parse("2/minute")
        user = uuid.uuid4().hex
        try:
            assert await limiter.hit(item, "frames", user)
            assert await limiter.hit(item, "frames", user)
            assert not await limiter.hit(item, "frames", user), "the third is over the limit"
        finally:
            await pool.aclose()

    asyncio.run(run())


def test_a_connection_used_without_connect_still_asks_the_sentinels(
    cluster: SentinelCluster,
) -> None:
    """The gateway's relay readers take a bare connection from ``make_connection()`` and send
    on it at once; redis-py 8 alone would dial localhost:6379 (whatever answers there)."""

    async def run() -> tuple[str, int]:
        pool = async_pool(cluster.url, decode_responses=True)
        connection: Any = pool.make_connection()  # type: ignore[no-untyped-call]
        try:
            await connection.send_command("CLIENT", "SETNAME", "bare")
            assert await connection.read_response() == "OK"
            return connection.host, connection.port
        finally:
            await connection.disconnect()

    assert asyncio.run(run()) == ("127.0.0.1", cluster.master_port())
    sync = sync_client(cluster.url)
    try:
        bare: Any = sync.connection_pool.make_connection()
        bare.send_command("PING")
        assert bare.read_response() in (b"PONG", "PONG")
        assert bare.port == cluster.master_port()
        bare.disconnect()
    finally:
        sync.close()
