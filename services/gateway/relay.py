"""Relay of conversation event streams to the sockets of this gateway process.

Every conversation with a local subscriber is followed from a concrete last id by one of
the process's ``StreamReader``s (one connection, one ``XREAD`` over up to
``STREAMS_PER_READ`` streams; see stream_reader.py), and each event it reads is offered
to every subscription of its conversation. Joining loses nothing and duplicates nothing:

1. the subscription registers first, buffering what is offered; the conversation's
   starting position is known (and handed to a reader) before step 2 starts;
2. the subscriber's writer replays the stored events after ``after`` page by page (paced
   by the socket, so a long history never floods the bounded queue);
3. it then sends the buffered live events and switches to live delivery.

Every event passes one check: its id must be after the last id sent on that subscription.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable

from redis.asyncio.connection import ConnectionPool

from signalbox.services.gateway.stream_reader import Entry, StreamReader
from signalbox.shared.event_stream import AsyncEventStream, decode, id_after
from signalbox.shared.events import Event

log = logging.getLogger(__name__)

REPLAY_PAGE = 500  # events read per XRANGE while catching up
# New streams wake the read at once (stream_reader.py); the block only bounds the delay if
# a wake-up is lost, and costs one idle XREAD per reader per period.
FOLLOW_BLOCK_MS = 1_000
# redis-py 8 defaults to a 5 s socket timeout; a blocked XREAD must never hit it.
RELAY_SOCKET_TIMEOUT_S = FOLLOW_BLOCK_MS / 1000 + 10
# Streams in one XREAD: Redis and the packing cost ~1 µs per stream on every read, and a
# read follows nearly every event, so past this a second connection takes the next ones.
STREAMS_PER_READ = 1_000

Deliver = Callable[[Event, str], None]  # queues one event (and its JSON); raises QueueFull


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
        self._buffer: deque[tuple[Event, str]] | None = deque()

    @property
    def live(self) -> bool:
        """True once the replay is done and events go straight to the owner's queue."""
        return self._buffer is None

    def _is_new(self, event_id: str) -> bool:
        return self.last_id is None or id_after(event_id, self.last_id)

    def _overflow(self) -> None:
        self.closed = True
        self._on_overflow()

    def offer(self, event: Event, text: str) -> None:
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
    ) -> AsyncIterator[tuple[Event, str]]:
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
            event, text = buffer.popleft()
            if self._is_new(event.id):
                self.last_id = event.id
                yield event, text
        # No await between the buffer running dry and this switch, so nothing slips between.
        self._buffer = None


class _Followed:
    """A conversation followed by this process: its subscriptions and where it is read."""

    def __init__(self, conversation_id: str, key: str) -> None:
        self.conversation_id = conversation_id
        self.key = key
        self.subscriptions: set[Subscription] = set()
        self.reader: StreamReader | None = None  # set once its starting position is known
        self.started: asyncio.Future[None] = asyncio.get_running_loop().create_future()


class RelayHub:
    """The followed conversations of one gateway process, read by a few ``StreamReader``s.

    Each reader holds one connection and follows up to ``streams_per_read`` conversations,
    so a process needs one connection per that many followed conversations, not one each.
    """

    def __init__(
        self,
        stream: AsyncEventStream,
        read_pool: ConnectionPool,
        buffer_limit: int,
        block_ms: int = FOLLOW_BLOCK_MS,
        streams_per_read: int = STREAMS_PER_READ,
    ) -> None:
        self.stream = stream
        self.buffer_limit = buffer_limit
        self.readers: list[StreamReader] = []
        self._read_pool = read_pool
        self._block_ms = block_ms
        self._streams_per_read = streams_per_read
        self._id = uuid.uuid4().hex[:12]
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
        reader.add(followed.key, position)
        followed.reader = reader
        # The position is known before any joiner replays: step 1 of the module docstring.
        followed.started.set_result(None)
        await reader.wake()

    def _reader_with_room(self) -> StreamReader:
        for reader in self.readers:
            if len(reader) < self._streams_per_read:
                return reader
        wake_key = self.stream.keys.relay_wake(f"{self._id}-{len(self.readers)}")
        reader = StreamReader(
            self._read_pool, self.stream.client, wake_key, self._hand_on, self._block_ms
        )
        self.readers.append(reader)
        return reader

    def _hand_on(self, key: str, entries: list[Entry]) -> None:
        followed = self._by_key.get(key)
        if followed is None:
            return
        for event_id, fields in entries:
            try:
                event = decode(
                    followed.conversation_id,
                    event_id,
                    dict(zip(fields[::2], fields[1::2], strict=True)),
                )
            except (ValueError, TypeError) as exc:  # not an event: skipped, not fatal
                log.error("relay %s: unreadable entry %s: %s", key, event_id, exc)
                continue
            text = event.model_dump_json()
            for subscription in list(followed.subscriptions):
                subscription.offer(event, text)

    async def aclose(self) -> None:
        """Stop every reader (gateway shutdown)."""
        for task in list(self._starts):
            task.cancel()
        self._followed.clear()
        self._by_key.clear()
        readers, self.readers = self.readers, []
        for reader in readers:
            await reader.aclose()
