"""One timer thread per orchestrator process, for every running turn's lease and deadline.

A turn used to start a thread for its lease's heartbeat and another for its deadline: two
thread starts before its first event, each waiting for the new thread to get the GIL, on
every turn. Here one daemon thread runs every due callback in time order, started the first
time anything is scheduled (and again after a fork). A callback runs on that thread, so it
must be short or wait on I/O only (a lease renewal is one Redis round trip; a deadline sets
an event): a callback that raises is logged and not run again.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class Timer:
    """A scheduled callback; ``cancel()`` keeps it from running (again)."""

    __slots__ = ("callback", "cancelled", "every_s")

    def __init__(self, callback: Callable[[], object], every_s: float | None) -> None:
        self.callback = callback
        self.every_s = every_s  # None: once
        self.cancelled = False

    def cancel(self) -> None:
        """Not run from now on; a run already under way finishes."""
        self.cancelled = True


class Timers:
    """``call_at(when, fn)`` once, or ``call_every(s, fn)`` until ``fn`` returns False."""

    def __init__(self, name: str = "timers") -> None:
        self.name = name
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def call_at(self, when: float, callback: Callable[[], object]) -> Timer:
        """Run ``callback`` once at ``when`` (``time.monotonic()`` time)."""
        timer = Timer(callback, None)
        self._push(when, timer)
        return timer

    def call_every(self, every_s: float, callback: Callable[[], object]) -> Timer:
        """Run ``callback`` every ``every_s`` seconds from now (counted from the end of its
        last run, so a slow run never piles up) until it returns False or is cancelled."""
        timer = Timer(callback, every_s)
        self._push(time.monotonic() + every_s, timer)
        return timer

    def _push(self, when: float, timer: Timer) -> None:
        with self._cond:
            heapq.heappush(self._heap, (when, next(self._seq), timer))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            elif self._heap[0][2] is timer:
                self._cond.notify()  # due before whatever the thread waits for now

    def _next_due(self) -> Timer:
        """Wait for the earliest timer that is due and still wanted, and take it."""
        with self._cond:
            while True:
                while self._heap and self._heap[0][2].cancelled:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                when = self._heap[0][0]
                left_s = when - time.monotonic()
                if left_s > 0:
                    self._cond.wait(left_s)
                    continue
                return heapq.heappop(self._heap)[2]

    def _run(self) -> None:
        while True:
            timer = self._next_due()
            try:
                again = timer.callback()
            except Exception:
                log.exception("timer callback %r failed; not run again", timer.callback)
                continue
            if timer.every_s is not None and again is not False and not timer.cancelled:
                with self._cond:
                    heapq.heappush(
                        self._heap, (time.monotonic() + timer.every_s, next(self._seq), timer)
                    )

    def _after_fork(self) -> None:
        # The child has no timer thread and none of the parent's turns.
        self._cond = threading.Condition()
        self._heap = []
        self._thread = None


TIMERS = Timers("turn-timers")  # the process's one timer thread
os.register_at_fork(after_in_child=TIMERS._after_fork)
