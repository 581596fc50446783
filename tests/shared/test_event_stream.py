"""The per-conversation event stream on a real Redis."""

from __future__ import annotations

import contextlib
import itertools
import logging
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis
import redis.asyncio as aioredis

from signalbox.shared import event_stream
from signalbox.shared.event_stream import (
    AsyncEventStream,
    EventStream,
    ReplayGap,
    check_event_id,
    id_after,
)
from signalbox.shared.redis_keys import RedisKeys


def test_read_after_returns_exactly_the_later_events(
    redis_client: redis.Redis, keys: RedisKeys
) -> None:
    stream = EventStream(redis_client, keys)
    conv = f"conv_{uuid.uuid4().hex}"
    ids = [stream.append(conv, "text_delta", {"text": str(i)}, turn_id="t1") for i in range(5)]
    assert all(id_after(b, a) for a, b in itertools.pairwise(ids))

    everything = stream.read_after(conv, None)
    assert [e.id for e in everything] == ids
    assert [e.data["text"] for e in everything] == ["0", "1", "2", "3", "4"]
    assert everything[0].conversation_id == conv and everything[0].turn_id == "t1"

    later = stream.read_after(conv, ids[2])
    assert [e.id for e in later] == ids[3:]
    assert stream.read_after(conv, ids[-1]) == []


def test_event_data_is_checked_against_its_kind(redis_client: redis.Redis, keys: RedisKeys) -> None:
    stream = EventStream(redis_client, keys)
    with pytest.raises(ValueError):
        stream.append("conv_x", "tool_call_finished", {"call_id": "c"})


def test_a_trimmed_stream_reports_a_replay_gap(redis_client: redis.Redis, keys: RedisKeys) -> None:
    stream = EventStream(redis_client, keys)
    conv = f"conv_{uuid.uuid4().hex}"
    stream.append(conv, "text_delta", {"text": "old"})
    kept = stream.append(conv, "text_delta", {"text": "new"})
    redis_client.xtrim(keys.events(conv), maxlen=1, approximate=False)
    with pytest.raises(ReplayGap):
        stream.read_after(conv, "0-1")
    assert [e.data["text"] for e in stream.read_after(conv, None)] == ["new"]
    assert stream.read_after(conv, kept) == []


def test_malformed_ids_are_refused() -> None:
    assert check_event_id("1700000000000-0") == "1700000000000-0"
    for bad in ("$", "abc", "1-2-3", "", "0"):
        with pytest.raises(ValueError):
            check_event_id(bad)


@contextlib.contextmanager
def _bells(client: redis.Redis, channel: str) -> Iterator[Callable[[], str | None]]:
    """Subscribed to ``channel``: a function that returns the next bell's data (None: none
    within the deadline)."""
    pubsub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
    try:
        pubsub.subscribe(channel)
        assert pubsub.get_message(timeout=BELL_DEADLINE_S) is None  # the confirmation, skipped

        def next_bell() -> str | None:
            message = pubsub.get_message(timeout=BELL_DEADLINE_S)
            return None if message is None else str(message["data"])

        yield next_bell
    finally:
        pubsub.close()


BELL_DEADLINE_S = 5.0


def test_every_append_rings_the_streams_bell(redis_client: redis.Redis, keys: RedisKeys) -> None:
    stream = EventStream(redis_client, keys)
    conv = f"conv_{uuid.uuid4().hex}"
    with _bells(redis_client, keys.events_bell(conv)) as next_bell:
        one = stream.append(conv, "text_delta", {"text": "a"}, turn_id="t1")
        assert next_bell() is not None
        assert [e.id for e in stream.read_after(conv, None)] == [one]

        pair = [("text_delta", {"text": "b"}), ("text_delta", {"text": "c"})]
        many = stream.append_many(conv, pair)  # type: ignore[arg-type]
        assert len(many) == 2 and next_bell() is not None
        assert [e.id for e in stream.read_after(conv, one)] == many


@pytest.mark.anyio
async def test_an_asyncio_append_rings_the_bell_too(redis_url: str, keys: RedisKeys) -> None:
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    sync_client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        conv = f"conv_{uuid.uuid4().hex}"
        with _bells(sync_client, keys.events_bell(conv)) as next_bell:
            stream = AsyncEventStream(client, keys)
            event_id = await stream.append(conv, "text_delta", {"text": "a"})
            assert next_bell() is not None
        assert [e.id for e in EventStream(sync_client, keys).read_after(conv, None)] == [event_id]
    finally:
        await client.aclose()
        sync_client.close()


def test_a_bell_refused_by_acl_stores_the_event_once_and_says_so_once(
    channelless_redis_url: str,
    keys: RedisKeys,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(event_stream, "_bells_failing", False)  # as a new process starts
    caplog.set_level(logging.DEBUG, logger=event_stream.__name__)
    client = redis.Redis.from_url(channelless_redis_url)
    try:
        stream = EventStream(client, keys)
        conv = f"conv_{uuid.uuid4().hex}"
        one = stream.append(conv, "text_delta", {"text": "a"})
        pair = [("text_delta", {"text": "b"}), ("text_delta", {"text": "c"})]
        many = stream.append_many(conv, pair)  # type: ignore[arg-type]
        assert [e.id for e in stream.read_after(conv, None)] == [one, *many]
        failures = [r.levelno for r in caplog.records if "bell failed" in r.getMessage()]
        assert failures == [logging.WARNING, logging.DEBUG]  # said once, not per append
    finally:
        client.close()
