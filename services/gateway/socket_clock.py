"""One clock per gateway process for every WebSocket's heartbeat and idle timeout.

A socket used to keep a timer of its own. With 10,000 idle sockets that is 10,000 timer
handles in the event loop's heap, each re-armed (a heap push) at every beat. Here one task
serves them all: time is cut into slots (1/50 of the shortest period, ``SLOTS_PER_PERIOD``),
each registered socket sits in the bucket of the slot its next deadline falls in, and the
task wakes at the start of the earliest non-empty slot, takes that bucket whole and calls
``on_clock(now)`` of each socket in it, which answers its next deadline (or None: done).

A bucket's slot starts at or after every deadline in it, so nothing is called early; it is
called at most one slot late (2% of the period), plus whatever the loop itself is late by.
A tick touches only the sockets that are due, and an idle gateway with no socket sleeps.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
from typing import Protocol

log = logging.getLogger(__name__)

SLOTS_PER_PERIOD = 50  # a deadline is met at most 1/50 of the shortest period late
MIN_SLOT_S = 0.001  # a period of 0 (or less) must not spin the clock


class Clocked(Protocol):
    """What the clock calls: a socket's heartbeat and idle timeout."""

    def on_clock(self, now: float) -> float | None:
        """Do what is due at ``now`` (loop time); return the next deadline, or None."""
        ...


def slot_for(heartbeat_s: float, idle_timeout_s: float) -> float:
    """The slot length for sockets with these periods: 1/50 of the shorter."""
    return max(MIN_SLOT_S, min(heartbeat_s, idle_timeout_s) / SLOTS_PER_PERIOD)


class SocketClock:
    """Calls each registered ``Clocked`` when its deadline comes, from one task."""

    def __init__(self, slot_s: float) -> None:
        self.slot_s = slot_s
        self._buckets: dict[int, set[Clocked]] = {}  # slot index -> the sockets due in it
        self._slot_of: dict[Clocked, int] = {}  # each registered socket's bucket
        self._heap: list[int] = []  # slot indices of buckets (may hold stale ones)
        self._task: asyncio.Task[None] | None = None
        self._wakeup: asyncio.Future[None] | None = None  # what the task sleeps on
        self._target: int | None = None  # the slot it sleeps until
        self._closed = False  # after aclose no task is started again (a late socket waits)

    @property
    def registered(self) -> int:
        """How many sockets the clock holds (for tests and metrics)."""
        return len(self._slot_of)

    @property
    def slots(self) -> int:
        """How many slots have sockets waiting in them."""
        return len(self._buckets)

    def __contains__(self, client: object) -> bool:
        return client in self._slot_of

    def register(self, client: Clocked, due: float) -> None:
        """Call ``client.on_clock`` once the loop's time reaches ``due``."""
        self.unregister(client)
        if not math.isfinite(due):
            return  # never due (heartbeat and idle timeout both infinite): nothing to call
        self._put(client, self._first_slot_at_or_after(due))
        if not self._closed and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._run(), name="ws-clock")

    def unregister(self, client: Clocked) -> None:
        """Forget ``client`` (a no-op if it is not registered)."""
        index = self._slot_of.pop(client, None)
        if index is None:
            return
        bucket = self._buckets.get(index)
        if bucket is not None:
            bucket.discard(client)
            if not bucket:
                del self._buckets[index]  # its heap entry goes stale, skipped when reached

    async def aclose(self) -> None:
        """Stop the task for good (registered sockets are the sessions' to close)."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def _first_slot_at_or_after(self, due: float) -> int:
        """The first slot that starts at or after ``due`` (exactly, despite rounding)."""
        index = math.ceil(due / self.slot_s)
        return index + 1 if index * self.slot_s < due else index

    def _last_slot_begun(self, now: float) -> int:
        """The last slot that starts at or before ``now`` (exactly, despite rounding)."""
        index = math.floor(now / self.slot_s)
        if (index + 1) * self.slot_s <= now:
            return index + 1
        return index - 1 if index * self.slot_s > now else index

    def _put(self, client: Clocked, index: int) -> None:
        self._slot_of[client] = index
        bucket = self._buckets.get(index)
        if bucket is None:
            self._buckets[index] = bucket = set()
            heapq.heappush(self._heap, index)
            wakeup, target = self._wakeup, self._target
            # The task sleeps past this slot (or with nothing due): wake it to sleep less.
            if wakeup is not None and not wakeup.done() and (target is None or index < target):
                wakeup.set_result(None)
        bucket.add(client)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        heap, buckets = self._heap, self._buckets
        while True:
            while heap and heap[0] not in buckets:
                heapq.heappop(heap)  # emptied by unregister
            target = heap[0] if heap else None
            if target is not None and target * self.slot_s <= loop.time():
                self.tick(loop.time())
                continue
            self._target = target
            self._wakeup = wakeup = loop.create_future()
            timer = None if target is None else loop.call_at(target * self.slot_s, _wake, wakeup)
            try:
                await wakeup
            finally:
                if timer is not None:
                    timer.cancel()
                self._wakeup = self._target = None

    def tick(self, now: float) -> None:
        """Call every socket of every slot that has begun by ``now`` (the task calls this at
        the start of each slot with sockets in it; tests call it with a time of theirs)."""
        heap, buckets, slot_of = self._heap, self._buckets, self._slot_of
        current = self._last_slot_begun(now)
        while heap and heap[0] <= current:
            index = heapq.heappop(heap)
            bucket = buckets.pop(index, None)
            if bucket is None:
                continue
            for client in bucket:
                if slot_of.get(client) != index:
                    continue  # unregistered by an earlier callback of this tick
                del slot_of[client]
                try:
                    due = client.on_clock(now)
                except Exception:
                    log.exception("a websocket's clock callback failed; it is dropped")
                    continue
                if due is not None:
                    # Never a slot already served: a deadline that has passed (the client
                    # was late) is met at the next one.
                    self._put(client, max(self._first_slot_at_or_after(due), current + 1))


def _wake(wakeup: asyncio.Future[None]) -> None:
    if not wakeup.done():
        wakeup.set_result(None)
