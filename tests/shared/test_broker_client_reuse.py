"""kombu's Redis channel builds one Redis client and keeps it, not one per command.

kombu (5.7) built a new ``redis.Redis`` for every message it published, every delivery it
recorded in the unacked index and every acknowledgement: as much CPU as the round trip
itself. ``broker_fixes`` keeps one per channel and pool. These tests count the clients a
channel builds while it publishes, delivers and acknowledges on a real Redis, and check that
a channel whose pools were dropped (kombu does it after a fork, or when its first ping
fails) builds a client on its new pool rather than reusing one bound to the old.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from kombu.transport import redis as kombu_redis

from signalbox.shared.celery_app import make_celery
from signalbox.shared.settings import CommonSettings

MESSAGES = 20


@pytest.fixture
def app(redis_url: str) -> Iterator[Celery]:
    settings = CommonSettings(redis_url=redis_url, redis_prefix=f"reuse-{uuid.uuid4().hex[:8]}:")
    celery = make_celery("client-reuse-test", settings)  # installs broker_fixes
    yield celery
    celery.close()


def _key(app: Celery, name: str) -> str:
    """The Redis key of the transport's ``name`` (a queue, ``unacked``) under the app's prefix."""
    return f"{app.conf.broker_transport_options['global_keyprefix']}{name}"


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every client a kombu Redis channel builds, in order."""
    clients: list[Any] = []
    channel: Any = kombu_redis.Channel
    original = channel._create_client

    def counting(self: Any, asynchronous: bool = False) -> Any:
        client = original(self, asynchronous)
        clients.append(client)
        return client

    monkeypatch.setattr(channel, "_create_client", counting)
    return clients


def test_publishing_delivering_and_acknowledging_build_one_client(
    app: Celery, built: list[Any], redis_client: redis.Redis
) -> None:
    queue, unacked = "client-reuse", _key(app, "unacked")
    with app.connection() as conn:
        channel: Any = conn.default_channel  # kombu's Redis channel (its stubs: StdChannel)
        for n in range(MESSAGES):
            app.send_task("noop", args=[n], queue=queue, connection=conn)  # on its channel
        assert redis_client.llen(_key(app, queue)) == MESSAGES  # they are really in Redis
        taken = [channel.basic_get(queue, no_ack=False) for _ in range(MESSAGES)]
        assert all(message is not None for message in taken)
        assert redis_client.hlen(unacked) == MESSAGES  # each delivery recorded
        for message in taken:
            message.ack()
        assert redis_client.hlen(unacked) == 0  # and each acknowledgement

        # One client for every command of the channel (kombu's own built 3 a message), and
        # the one kombu keeps itself for BRPOP on its second pool (built when it connected).
        assert [c.connection_pool for c in built] == [channel.async_pool, channel.pool]


def test_a_channel_with_new_pools_builds_a_client_on_the_new_pool(
    app: Celery, built: list[Any], redis_client: redis.Redis
) -> None:
    with app.connection() as conn:
        channel: Any = conn.default_channel
        app.send_task("noop", queue="client-reuse-new-pool", connection=conn)
        old_pool = channel.pool
        channel._disconnect_pools()  # what kombu does after a fork
        app.send_task("noop", queue="client-reuse-new-pool", connection=conn)

        assert redis_client.llen(_key(app, "client-reuse-new-pool")) == 2
        on_sync_pools = [c.connection_pool for c in built if c is not channel.client]
        assert on_sync_pools == [old_pool, channel.pool]
        assert channel.pool is not old_pool
