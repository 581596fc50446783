"""The per-conversation event stream on a real Redis."""

from __future__ import annotations

import itertools
import uuid

import pytest
import redis

from signalbox.shared.event_stream import EventStream, ReplayGap, check_event_id, id_after
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
