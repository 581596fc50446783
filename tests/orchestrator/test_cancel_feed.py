"""The orchestrator process's one listener on the control channel (``cancel_watch.py``)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import redis

from signalbox.redis_server import start_redis
from signalbox.services.orchestrator import cancel_watch
from signalbox.services.orchestrator.cancel_watch import CancelWatch, feed_for

from .support import wait_for


def _cancel(client: redis.Redis, channel: str, turn_id: str) -> None:
    client.publish(channel, json.dumps({"type": "cancel", "turn_id": turn_id}))


def test_a_cancel_reaches_the_turn_it_names_and_no_other(redis_client: redis.Redis) -> None:
    channel = f"test:control:{uuid.uuid4().hex}"
    with (
        CancelWatch(redis_client, channel, "turn-a") as a,
        CancelWatch(redis_client, channel, "turn-b") as b,
    ):
        assert feed_for(redis_client, channel) is a._feed is b._feed, "one feed for both"
        _cancel(redis_client, channel, "turn-a")
        wait_for(a.is_set, what="turn-a's cancel to be heard")
        # Heard in order on one subscription: a later message for b fences the first.
        redis_client.publish(channel, "not json")
        redis_client.publish(channel, json.dumps({"type": "other", "turn_id": "turn-b"}))
        fence = CancelWatch(redis_client, channel, "fence")
        with fence:
            _cancel(redis_client, channel, "fence")
            wait_for(fence.is_set, what="the fence")
        assert not b.is_set()
    with CancelWatch(redis_client, channel, "turn-a") as later:
        _cancel(redis_client, channel, "turn-b")  # nobody watches turn-b any more
        _cancel(redis_client, channel, "turn-a")
        wait_for(later.is_set, what="the later watch of turn-a to hear its cancel")


def test_an_idle_feed_unsubscribes_and_the_next_turn_subscribes_it_again(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cancel_watch, "IDLE_S", 0.0)
    channel = f"test:control:{uuid.uuid4().hex}"

    def listeners() -> int:
        counts = dict(redis_client.pubsub_numsub(channel))
        return int(counts.get(channel.encode(), 0))

    with CancelWatch(redis_client, channel, "turn-a") as watch:
        assert listeners() == 1
        _cancel(redis_client, channel, "turn-a")
        wait_for(watch.is_set, what="the cancel")
    wait_for(lambda: listeners() == 0, what="the idle feed to unsubscribe")
    with CancelWatch(redis_client, channel, "turn-b") as watch:
        assert listeners() == 1
        _cancel(redis_client, channel, "turn-b")
        wait_for(watch.is_set, what="the cancel after resubscribing")


def test_the_feed_resubscribes_after_redis_comes_back(tmp_path: Path) -> None:
    server = start_redis(tmp_path / "redis", persistent=False)
    port = server.port
    client = redis.Redis.from_url(server.url, socket_timeout=1, socket_connect_timeout=1)
    channel = f"test:control:{uuid.uuid4().hex}"
    try:
        with CancelWatch(client, channel, "turn-a") as watch:
            feed = feed_for(client, channel)
            first = feed._subscribed
            server.stop()
            wait_for(lambda: feed._subscribed is not first, what="the feed to notice")
            server = start_redis(tmp_path / "redis", persistent=False, port=port)
            wait_for(feed._subscribed.is_set, 15, what="the feed to resubscribe")
            _cancel(client, channel, "turn-a")
            wait_for(watch.is_set, what="a cancel after the restart")
    finally:
        client.close()
        server.stop()


def test_a_turn_starting_while_redis_is_away_goes_on_without_the_feed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It waits a bounded time for the subscription, then relies on the SQL flag."""
    monkeypatch.setattr(cancel_watch, "SUBSCRIBED_WAIT_S", 0.2)
    server = start_redis(tmp_path / "redis", persistent=False)
    client = redis.Redis.from_url(server.url, socket_timeout=0.5, socket_connect_timeout=0.5)
    server.stop()
    try:
        with CancelWatch(client, f"test:control:{uuid.uuid4().hex}", "turn-a") as watch:
            assert not watch.is_set()  # no ConnectionError: the turn goes on
    finally:
        client.close()


def test_the_feed_outlives_its_connection_closed_under_it(redis_url: str) -> None:
    # Closing a pool's connections (``disconnect``) while the feed waits in a read leaves
    # redis-py's reader with no socket: it raised TypeError, and the feed's thread died, so
    # no cancel was heard promptly again in that process.
    client = redis.Redis.from_url(redis_url)
    channel = f"test:control:{uuid.uuid4().hex}"
    try:
        with CancelWatch(client, channel, "turn-a") as watch:
            client.connection_pool.disconnect()

            def heard() -> bool:
                _cancel(client, channel, "turn-a")  # again until the resubscribed feed hears
                return watch.is_set()

            wait_for(heard, what="a cancel after the feed's connection was closed")
    finally:
        client.close()
