"""Relay of conversation event streams to the sockets of this gateway process.

One follower task per conversation that has a local subscriber blocks in ``XREAD`` from a
concrete last id and offers each event to every subscription. Joining loses nothing and
duplicates nothing:

1. the subscription registers with the follower first, buffering what the follower
   offers; the follower's starting position is known before step 2 starts;
2. the subscriber's writer replays the stored events after ``after`` page by page (paced
   by the socket, so a long history never floods the bounded queue);
3. it then sends the buffered live events and switches to live delivery.

Every event passes one check: its id must be after the last id sent on that subscription.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable

import redis.exceptions

from shared.event_stream import AsyncEventStream, id_after
from shared.events import Event

log = logging.getLogger(__name__)

REPLAY_PAGE = 500  # events read per XRANGE while catching up
FOLLOW_BLOCK_MS = 5_000  # a follower is stopped by cancellation, so a long block costs nothing
# redis-py 8 defaults to a 5 s socket timeout, which would cut every blocked XREAD short.
RELAY_SOCKET_TIMEOUT_S = FOLLOW_BLOCK_MS / 1000 + 10
FOLLOW_RETRY_S = 0.5  # back-off after a Redis error, so a Redis outage is not a busy loop

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
        """Called by the follower for each new event; never blocks."""
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


class _Follower:
    """The one XREAD loop of a conversation in this process."""

    def __init__(self, hub: RelayHub, conversation_id: str) -> None:
        self.hub = hub
        self.conversation_id = conversation_id
        self.subscriptions: set[Subscription] = set()
        self.position = "0-0"
        self.started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.task: asyncio.Task[None] = asyncio.create_task(
            self._run(), name=f"relay:{conversation_id}"
        )

    async def _run(self) -> None:
        stream = self.hub.stream
        try:
            self.position = await stream.last_id(self.conversation_id)
        except Exception as exc:
            self.started.set_exception(exc)
            self.hub._forget(self)
            return
        self.started.set_result(None)
        while True:
            try:
                events = await stream.wait_after(
                    self.conversation_id, self.position, FOLLOW_BLOCK_MS
                )
            except (redis.exceptions.RedisError, OSError) as exc:
                log.warning("relay %s: Redis error %s; retrying", self.conversation_id, exc)
                await asyncio.sleep(FOLLOW_RETRY_S)
                continue
            for event in events:
                self.position = event.id
                text = event.model_dump_json()
                for subscription in list(self.subscriptions):
                    subscription.offer(event, text)


class RelayHub:
    """The followers of one gateway process, started and stopped by their subscriptions."""

    def __init__(self, stream: AsyncEventStream, buffer_limit: int) -> None:
        self.stream = stream
        self.buffer_limit = buffer_limit
        self._followers: dict[str, _Follower] = {}

    @property
    def followed(self) -> list[str]:
        """Conversations with a running follower (for tests and metrics)."""
        return list(self._followers)

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
        follower = self._followers.get(conversation_id)
        if follower is None:
            follower = _Follower(self, conversation_id)
            self._followers[conversation_id] = follower
        subscription = Subscription(conversation_id, after, deliver, on_overflow, self.buffer_limit)
        follower.subscriptions.add(subscription)
        try:
            # Shielded: one joiner giving up must not fail the start for the others.
            await asyncio.shield(follower.started)
            page = await self.stream.read_after(conversation_id, after, count=REPLAY_PAGE)
        except BaseException:
            self.unsubscribe(subscription)
            raise
        return subscription, page

    def unsubscribe(self, subscription: Subscription) -> None:
        """Stop delivering to ``subscription``; the follower stops with its last subscriber."""
        subscription.closed = True
        follower = self._followers.get(subscription.conversation_id)
        if follower is None:
            return
        follower.subscriptions.discard(subscription)
        if not follower.subscriptions:
            self._forget(follower)
            follower.task.cancel()

    def _forget(self, follower: _Follower) -> None:
        if self._followers.get(follower.conversation_id) is follower:
            del self._followers[follower.conversation_id]

    async def aclose(self) -> None:
        """Stop every follower (gateway shutdown)."""
        followers = list(self._followers.values())
        self._followers.clear()
        for follower in followers:
            follower.task.cancel()
        for follower in followers:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await follower.task
