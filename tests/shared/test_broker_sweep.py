"""A worker killed while it swept for unacknowledged messages must not stop every other
worker's sweep for long: the lock it leaves behind expires in seconds, not kombu's 300.

Seen in CI: a chaos test SIGKILLed a worker inside its sweep (every 0.75 s at a 3 s
visibility timeout), and the next test's turn, longer than the visibility timeout, was never
delivered again within 30 s: nobody could take the sweep's lock.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from signalbox.processes import wait_until
from signalbox.shared.celery_app import UNACKED_MUTEX_EXPIRE_S, make_celery
from signalbox.shared.settings import CommonSettings

VISIBILITY_TIMEOUT_S = 1
DEADLINE_S = UNACKED_MUTEX_EXPIRE_S + 20  # kombu's own 300 s lock would outlast it


@pytest.fixture
def app(redis_url: str) -> Iterator[Celery]:
    prefix = f"sweep-{uuid.uuid4().hex[:8]}:"
    settings = CommonSettings(
        redis_url=redis_url, redis_prefix=prefix, visibility_timeout_s=VISIBILITY_TIMEOUT_S
    )
    celery = make_celery("sweep-test", settings)
    yield celery
    celery.close()


def test_a_sweep_lock_left_by_a_killed_worker_stops_redelivery_for_seconds_only(
    app: Celery, redis_client: redis.Redis
) -> None:
    prefix = app.conf.broker_transport_options["global_keyprefix"]
    queue = "sweep-test"
    app.send_task("noop", queue=queue)
    with app.connection() as conn:
        channel: Any = conn.default_channel  # kombu's Redis channel (its stubs: StdChannel)
        taken = channel.basic_get(queue, no_ack=False)  # a worker took it, never acked
        assert taken is not None
        assert redis_client.llen(f"{prefix}{queue}") == 0
        # The lock exactly as a sweeper SIGKILLed inside its sweep leaves it.
        redis_client.set(f"{prefix}unacked_mutex", "a-dead-worker", ex=channel.unacked_mutex_expire)

        def restored() -> bool:
            channel.qos.restore_visible(interval=1)  # what every worker's poll loop runs
            return bool(redis_client.llen(f"{prefix}{queue}"))

        started = time.monotonic()
        wait_until(restored, DEADLINE_S, "the unacknowledged message to be delivered again")
    assert time.monotonic() - started >= VISIBILITY_TIMEOUT_S
