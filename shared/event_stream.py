"""A conversation's events on a Redis Stream: append, and read everything after an id.

Redis assigns the ids, so they increase within a conversation and a client can resume
from the last one it saw. The stream is capped; a resume from before the cap is a
``ReplayGap`` and the client reloads the conversation over HTTP.

Every append also rings the stream's bell (``ring``: a ``PUBLISH`` on
``RedisKeys.events_bell`` in the same round trip, after the ``XADD``): the gateways read a
stream when its bell rings (services/gateway/stream_reader.py). A writer that does not
ring is still relayed, up to the gateways' sweep (1 s) later.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

import redis
import redis.asyncio as aioredis

from signalbox.shared.events import EVENT_DATA, Event, EventKind, utc_now
from signalbox.shared.redis_keys import RedisKeys

log = logging.getLogger(__name__)

STREAM_MAXLEN = 10_000  # events kept per conversation; older ones answer replay_gap
BELL = "1"  # what a bell carries: its channel says which stream has news
_ID = re.compile(r"\d{1,20}-\d{1,20}")


class ReplayGap(Exception):
    """The requested id is older than what the stream still keeps."""


def check_event_id(event_id: str) -> str:
    """Return ``event_id`` if it has the shape of a stream id, else raise ``ValueError``."""
    if not _ID.fullmatch(event_id):
        raise ValueError(f"expected an event id like '1700000000000-0', got {event_id!r}")
    return event_id


def _id_tuple(event_id: str) -> tuple[int, int]:
    ms, seq = event_id.split("-")
    return int(ms), int(seq)


def id_after(a: str, b: str) -> bool:
    """True when event id ``a`` comes after ``b``."""
    return _id_tuple(a) > _id_tuple(b)


def encode(kind: EventKind, data: Mapping[str, Any], turn_id: str | None) -> dict[str, str]:
    """The stream entry of one event; ``data`` is checked against its kind's model."""
    model = EVENT_DATA[kind]
    checked = model.model_validate(dict(data)).model_dump(mode="json")
    body = {"turn_id": turn_id, "ts": utc_now(), "kind": kind, "data": checked}
    return {"e": json.dumps(body, separators=(",", ":"))}


def decode(conversation_id: str, event_id: Any, fields: Any) -> Event:
    """An ``Event`` from a stream entry."""
    raw = fields.get("e", fields.get(b"e"))
    body = json.loads(raw)
    eid = event_id.decode() if isinstance(event_id, bytes) else event_id
    return Event(conversation_id=conversation_id, id=eid, **body)


def _gap(info: Mapping[Any, Any], after: str) -> bool:
    """True when entries newer than ``after`` may have been trimmed away.

    Trimming removes the oldest entries, so a gap means: something was removed and
    ``after`` is older than the first entry still kept. Redis 7 counts what was ever
    added; older servers only let us see that the stream is at its cap.
    """
    first = info.get("first-entry", info.get(b"first-entry"))
    if not first:
        return False
    length = int(info.get("length", info.get(b"length", 0)))
    added = info.get("entries-added", info.get(b"entries-added"))
    trimmed = int(added) > length if added is not None else length >= STREAM_MAXLEN
    first_id = first[0].decode() if isinstance(first[0], bytes) else str(first[0])
    return trimmed and id_after(first_id, after)


def queue_appends(
    pipe: Any,
    keys: RedisKeys,
    conversation_id: str,
    events: Sequence[tuple[EventKind, Mapping[str, Any]]],
    turn_id: str | None,
) -> None:
    """Queue on ``pipe`` (sync or asyncio) the ``XADD`` of each event, in order, then the
    stream's bell; read what it executes (``raise_on_error=False``) with ``appended``."""
    key = keys.events(conversation_id)
    for kind, data in events:
        pipe.xadd(key, encode(kind, data, turn_id), maxlen=STREAM_MAXLEN, approximate=True)
    ring(pipe, keys, conversation_id)


def ring(pipe: Any, keys: RedisKeys, conversation_id: str) -> None:
    """Queue the bell of ``conversation_id``'s stream on ``pipe`` (a pipeline, sync or
    asyncio), after the ``XADD``s it rings for: a gateway that hears it reads the stream.
    Execute it with ``raise_on_error=False`` and read the results with ``appended``."""
    pipe.publish(keys.events_bell(conversation_id), BELL)


_bells_failing = False  # this process's bells have failed (logged once, then at DEBUG)


def _bell_failed(error: Exception) -> None:
    """Log a failed bell: the first at WARNING, the rest at DEBUG. A refusal (an ACL without
    the bells' channels) repeats on every append and would flood the log with one cause."""
    global _bells_failing
    level = logging.DEBUG if _bells_failing else logging.WARNING
    _bells_failing = True
    log.log(level, "an event stream's bell failed (relayed at the next sweep): %s", error)


def appended(results: list[Any], appends: int) -> list[str]:
    """A pipeline's first ``appends`` results (its ``XADD``s: their ids), raising the error
    of one that failed. The bell's error after them (a user whose ACL refuses the channel)
    is logged, not raised: the events are stored, a retry would store them twice, and the
    gateways' sweep relays them."""
    for result in results[:appends]:
        if isinstance(result, Exception):
            raise result
    for result in results[appends:]:
        if isinstance(result, Exception):
            _bell_failed(result)
    return [e.decode() if isinstance(e, bytes) else str(e) for e in results[:appends]]


class EventStream:
    """Synchronous access for workers and services that are not asyncio."""

    def __init__(self, client: redis.Redis, keys: RedisKeys) -> None:
        self.client = client
        self.keys = keys

    def append(
        self,
        conversation_id: str,
        kind: EventKind,
        data: Mapping[str, Any],
        turn_id: str | None = None,
    ) -> str:
        """Append one event, ring the stream's bell, and return the event's id."""
        return self._write(conversation_id, [(kind, data)], turn_id)[0]

    def append_many(
        self,
        conversation_id: str,
        events: Sequence[tuple[EventKind, Mapping[str, Any]]],
        turn_id: str | None = None,
    ) -> list[str]:
        """Append several events, in order, and ring the stream's bell once, in one round
        trip; their ids."""
        return self._write(conversation_id, events, turn_id)

    def _write(
        self,
        conversation_id: str,
        events: Sequence[tuple[EventKind, Mapping[str, Any]]],
        turn_id: str | None,
    ) -> list[str]:
        pipe = self.client.pipeline(transaction=False)
        queue_appends(pipe, self.keys, conversation_id, events, turn_id)
        return appended(pipe.execute(raise_on_error=False), len(events))

    def read_after(
        self, conversation_id: str, after: str | None, count: int | None = None
    ) -> list[Event]:
        """Stored events after ``after`` (None: from the start); ``ReplayGap`` if trimmed."""
        key = self.keys.events(conversation_id)
        if after is not None:
            check_event_id(after)
            if self.client.exists(key) and _gap(self.client.xinfo_stream(key), after):
                raise ReplayGap(after)
        start = "-" if after is None else f"({after}"
        entries: Any = self.client.xrange(key, min=start, max="+", count=count)
        return [decode(conversation_id, eid, fields) for eid, fields in entries]


class AsyncEventStream:
    """asyncio access for the gateway."""

    def __init__(self, client: aioredis.Redis, keys: RedisKeys) -> None:
        self.client = client
        self.keys = keys

    async def append(
        self,
        conversation_id: str,
        kind: EventKind,
        data: Mapping[str, Any],
        turn_id: str | None = None,
    ) -> str:
        """Append one event, ring the stream's bell, and return the event's id."""
        async with self.client.pipeline(transaction=False) as pipe:
            queue_appends(pipe, self.keys, conversation_id, [(kind, data)], turn_id)
            results = await pipe.execute(raise_on_error=False)
        return appended(results, 1)[0]

    async def read_after(
        self, conversation_id: str, after: str | None, count: int | None = None
    ) -> list[Event]:
        """Stored events after ``after`` (None: from the start); ``ReplayGap`` if trimmed."""
        key = self.keys.events(conversation_id)
        if after is not None:
            check_event_id(after)
            if await self.client.exists(key) and _gap(await self.client.xinfo_stream(key), after):
                raise ReplayGap(after)
        start = "-" if after is None else f"({after}"
        entries: Any = await self.client.xrange(key, min=start, max="+", count=count)
        return [decode(conversation_id, eid, fields) for eid, fields in entries]

    async def last_id(self, conversation_id: str) -> str:
        """The newest event id of a conversation, ``0-0`` when it has none."""
        entries = await self.client.xrevrange(self.keys.events(conversation_id), count=1)
        if not entries:
            return "0-0"
        eid = entries[0][0]
        return eid.decode() if isinstance(eid, bytes) else str(eid)

    async def wait_after(self, conversation_id: str, after: str, block_ms: int) -> list[Event]:
        """Block up to ``block_ms`` for events after ``after`` (a concrete id, never ``$``)."""
        key = self.keys.events(conversation_id)
        reply: Any = await self.client.xread({key: after}, block=block_ms)
        events: list[Event] = []
        for _stream, entries in reply or []:
            events.extend(decode(conversation_id, eid, fields) for eid, fields in entries)
        return events
