"""Relay of conversation event streams to the sockets of this gateway process.

Every conversation with a local subscriber is followed from a concrete last id by one of
the process's ``StreamReader``s (up to ``STREAMS_PER_READ`` streams each, subscribed to
their bells, each read when it rings; see stream_reader.py), and each event it reads is
offered to every subscription of its conversation. Joining loses nothing and duplicates nothing:

1. the subscription registers first, buffering what is offered; the conversation's
   starting position is known (and handed to a reader) before step 2 starts;
2. the subscriber's writer replays the stored events after ``after`` page by page (paced
   by the socket, so a long history never floods the bounded queue);
3. it then sends the buffered live events and switches to live delivery.

Every event passes one check: its id must be after the last id sent on that subscription.

A live event is relayed as the stream entry's own JSON: the entry (``shared/event_stream.py``
``encode``) is the event frame less its first three fields, so the frame is those fields
spliced before the entry's text, with no parse and no re-serialisation (``relay_frame``).
Only the fields the relay itself needs (id, kind, ts) are read, by one anchored match; an
entry that does not match (another writer's key order, an unknown kind) takes the old road,
a full decode (validated, skipped if unreadable) and ``model_dump_json``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import NamedTuple, Protocol

from redis.asyncio.connection import ConnectionPool

from signalbox.services.gateway.stream_reader import Entry, StreamReader
from signalbox.shared.event_stream import AsyncEventStream, decode, id_after
from signalbox.shared.events import EVENT_DATA, Event

log = logging.getLogger(__name__)

REPLAY_PAGE = 500  # events read per XRANGE while catching up
# Every stream is read when its bell rings (stream_reader.py); the sweep, one read of every
# followed stream, bounds the delay of an event whose writer did not ring.
SWEEP_S = 1.0
RELAY_SOCKET_TIMEOUT_S = 10.0
# Streams per reader: a sweep names all of them in one XREAD, at ~1 µs per stream.
STREAMS_PER_READ = 1_000

# The head of a stream entry as ``encode`` writes it: turn id (a plain id or null), ts, kind;
# the rest of the entry is ``"data":{...}}``. Ids and timestamps never hold a quote or a
# backslash, so a match is exact.
_ENTRY_HEAD = re.compile(
    r'\{"turn_id":(?:null|"[^"\\]*"),"ts":"([^"\\]*)","kind":"([a-z_]+)","data":'
)
_KINDS = frozenset(EVENT_DATA)


class EventHead(Protocol):
    """What the relay and its subscribers read of an event besides its frame's text."""

    @property
    def id(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def ts(self) -> str: ...


class Head(NamedTuple):
    """An ``EventHead`` read from a stream entry without decoding the rest of it."""

    id: str
    kind: str
    ts: str


Deliver = Callable[[EventHead, str], None]  # queues one event (and its frame); raises QueueFull


def frame_prefix(conversation_id: str) -> str:
    """The text every ``event`` frame of a conversation starts with, up to its id's value."""
    # json.dumps: a conversation id is an id, but the frame must stay JSON whatever it holds.
    return f'{{"type":"event","conversation_id":{json.dumps(conversation_id)},"id":"'


def relay_frame(prefix: str, event_id: str, raw: str) -> tuple[EventHead, str] | None:
    """An event's head and its ``event`` frame built from its stream entry's JSON text
    (``prefix``: ``frame_prefix`` of its conversation), or None when the entry is not in
    ``encode``'s shape (the caller decodes it instead).

    The frame holds the same fields in the same order as ``Event.model_dump_json``; only
    the spelling of the data may differ (non-ASCII escaped as ``\\uXXXX``), not its value.
    """
    match = _ENTRY_HEAD.match(raw)
    if match is None or match.group(2) not in _KINDS:
        return None
    # Event ids are Redis stream ids (digits and a dash): nothing in them needs escaping.
    return Head(event_id, match.group(2), match.group(1)), f'{prefix}{event_id}",{raw[1:]}'


class Subscription:
    """One subscriber's view of one conversation: buffering until caught up, then live."""

    def __init__(
        self,
        conversation_id: str,
        after: str | None,
        deliver: Deliver,
        on_overflow: Callable[[], None],
        buffer_limit: int,
    ) -> None:
        self.conversation_id = conversation_id
        self.last_id = after
        self.closed = False
        self._deliver = deliver
        self._on_overflow = on_overflow
        self._buffer_limit = buffer_limit
        self._buffer: deque[tuple[EventHead, str]] | None = deque()

    @property
    def live(self) -> bool:
        """True once the replay is done and events go straight to the owner's queue."""
        return self._buffer is None

    def _is_new(self, event_id: str) -> bool:
        return self.last_id is None or id_after(event_id, self.last_id)

    def _overflow(self) -> None:
        self.closed = True
        self._on_overflow()

    def offer(self, event: EventHead, text: str) -> None:
        """Called by the relay for each new event; never blocks."""
        if self.closed:
            return
        if self._buffer is not None:
            if len(self._buffer) >= self._buffer_limit:
                self._overflow()
                return
            self._buffer.append((event, text))
            return
        if not self._is_new(event.id):
            return
        self.last_id = event.id
        try:
            self._deliver(event, text)
        except asyncio.QueueFull:
            self._overflow()

    async def catch_up(
        self, first_page: list[Event], stream: AsyncEventStream
    ) -> AsyncIterator[tuple[EventHead, str]]:
        """Yield the stored events from ``first_page`` on, then the buffered ones; go live.

        The caller sends each one before asking for the next, so the socket paces the replay.
        """
        page = first_page
        while not self.closed:
            for event in page:
                if self.closed:
                    return
                if self._is_new(event.id):
                    self.last_id = event.id
                    yield event, event.model_dump_json()
            if len(page) < REPLAY_PAGE:
                break
            page = await stream.read_after(self.conversation_id, self.last_id, count=REPLAY_PAGE)
        buffer = self._buffer
        while buffer and not self.closed:
            head, text = buffer.popleft()
            if self._is_new(head.id):
                self.last_id = head.id
                yield head, text
        # No await between the buffer running dry and this switch, so nothing slips between.
        self._buffer = None


def _relayed(followed: _Followed, event_id: str, fields: list[str]) -> tuple[EventHead, str] | None:
    """One stream entry as (head, frame text); None (logged) for an entry that is no event."""
    if len(fields) == 2 and fields[0] == "e" and isinstance(fields[1], str):  # encode's entry
        relayed = relay_frame(followed.frame_prefix, event_id, fields[1])
        if relayed is not None:
            return relayed
    conversation_id = followed.conversation_id
    entry = dict(zip(fields[::2], fields[1::2], strict=True))
    try:
        event = decode(conversation_id, event_id, entry)
    except (ValueError, TypeError) as exc:  # not an event: skipped, not fatal
        log.error("relay %s: unreadable entry %s: %s", conversation_id, event_id, exc)
        return None
    return event, event.model_dump_json()


class _Followed:
    """A conversation followed by this process: its subscriptions and where it is read."""

    def __init__(self, conversation_id: str, key: str) -> None:
        self.conversation_id = conversation_id
        self.key = key
        self.frame_prefix = frame_prefix(conversation_id)
        self.subscriptions: set[Subscription] = set()
        self.reader: StreamReader | None = None  # set once its starting position is known
        self.started: asyncio.Future[None] = asyncio.get_running_loop().create_future()


class RelayHub:
    """The followed conversations of one gateway process, read by a few ``StreamReader``s.

    Each reader holds two connections (its bells, its reads) and follows up to
    ``streams_per_read`` conversations, so a process needs two connections per that many
    followed conversations, not one each.
    """

    def __init__(
        self,
        stream: AsyncEventStream,
        read_pool: ConnectionPool,
        buffer_limit: int,
        sweep_s: float = SWEEP_S,
        streams_per_read: int = STREAMS_PER_READ,
    ) -> None:
        self.stream = stream
        self.buffer_limit = buffer_limit
        self.readers: list[StreamReader] = []
        self._read_pool = read_pool
        self._sweep_s = sweep_s
        self._streams_per_read = streams_per_read
        self._followed: dict[str, _Followed] = {}  # by conversation id
        self._by_key: dict[str, _Followed] = {}  # by stream key
        self._starts: set[asyncio.Task[None]] = set()

    @property
    def followed(self) -> list[str]:
        """Conversations this process follows (for tests and metrics)."""
        return list(self._followed)

    async def subscribe(
        self,
        conversation_id: str,
        after: str | None,
        deliver: Deliver,
        on_overflow: Callable[[], None],
    ) -> tuple[Subscription, list[Event]]:
        """Register a buffering subscription and read the first replay page.

        Raises ``ReplayGap`` (after unregistering) if ``after`` is older than the stream.
        The caller sends its reply, then sends what ``subscription.catch_up(page, ...)`` yields.
        """
        followed = self._followed.get(conversation_id)
        if followed is None:
            followed = _Followed(conversation_id, self.stream.keys.events(conversation_id))
            self._followed[conversation_id] = followed
            self._by_key[followed.key] = followed
            task = asyncio.create_task(self._start(followed), name=f"relay-start:{conversation_id}")
            self._starts.add(task)
            task.add_done_callback(self._starts.discard)
        subscription = Subscription(conversation_id, after, deliver, on_overflow, self.buffer_limit)
        followed.subscriptions.add(subscription)
        try:
            # Shielded: one joiner giving up must not fail the start for the others.
            await asyncio.shield(followed.started)
            page = await self.stream.read_after(conversation_id, after, count=REPLAY_PAGE)
        except BaseException:
            self.unsubscribe(subscription)
            raise
        return subscription, page

    def unsubscribe(self, subscription: Subscription) -> None:
        """Stop delivering to ``subscription``; its conversation is dropped with the last one."""
        subscription.closed = True
        followed = self._followed.get(subscription.conversation_id)
        if followed is None:
            return
        followed.subscriptions.discard(subscription)
        if not followed.subscriptions:
            self._forget(followed)

    def _forget(self, followed: _Followed) -> None:
        if self._followed.get(followed.conversation_id) is followed:
            del self._followed[followed.conversation_id]
        if self._by_key.get(followed.key) is followed:
            del self._by_key[followed.key]
            if followed.reader is not None:
                followed.reader.remove(followed.key)

    async def _start(self, followed: _Followed) -> None:
        """Learn where the stream stands now, then hand it to a reader from there."""
        try:
            position = await self.stream.last_id(followed.conversation_id)
        except Exception as exc:
            self._forget(followed)
            followed.started.set_exception(exc)
            followed.started.exception()  # retrieved: its joiners raise it, none may be left
            return
        if self._by_key.get(followed.key) is not followed:
            followed.started.set_result(None)  # every joiner left meanwhile
            return
        reader = self._reader_with_room()
        reader.add(followed.key, self.stream.keys.events_bell(followed.conversation_id), position)
        followed.reader = reader
        # The position is known before any joiner replays: step 1 of the module docstring.
        followed.started.set_result(None)
        await reader.flush()

    def _reader_with_room(self) -> StreamReader:
        for reader in self.readers:
            if len(reader) < self._streams_per_read:
                return reader
        reader = StreamReader(self._read_pool, self._hand_on, self._sweep_s)
        self.readers.append(reader)
        return reader

    def _hand_on(self, key: str, entries: list[Entry]) -> None:
        followed = self._by_key.get(key)
        if followed is None:
            return
        for event_id, fields in entries:
            relayed = _relayed(followed, event_id, fields)
            if relayed is None:
                continue
            head, text = relayed
            for subscription in list(followed.subscriptions):
                subscription.offer(head, text)

    async def aclose(self) -> None:
        """Stop every reader (gateway shutdown)."""
        for task in list(self._starts):
            task.cancel()
        self._followed.clear()
        self._by_key.clear()
        readers, self.readers = self.readers, []
        for reader in readers:
            await reader.aclose()
