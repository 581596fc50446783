"""Hear a turn's cancel at once: one listener per process on the control channel sets the
event of every running turn a cancel names.

Pub/sub drops messages sent while nobody listens, so the loop also reads the committed
``turns.cancel_requested`` flag at its checkpoints; this only makes the cancel prompt.

One subscription serves every turn of the process (``CancelFeed``): a turn used to open a
pub/sub connection and start a thread of its own, before its first model step. The feed
subscribes when the first turn starts watching and unsubscribes (its thread ends) once no
turn has watched for ``IDLE_S``; while Redis is away it resubscribes, and the turns rely on
the SQL flag meanwhile.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import weakref
from types import TracebackType
from typing import Any

import redis

log = logging.getLogger(__name__)

POLL_S = 0.5  # longest wait for a message: bounds how late an idle feed notices it is idle
IDLE_S = 30.0  # a feed no turn has watched this long unsubscribes (and its thread ends)
RETRY_S = 0.5  # pause after a failed subscription before the next attempt
SUBSCRIBED_WAIT_S = 2.0  # longest a turn waits for the feed's first subscription


class CancelFeed:
    """The control channel of one Redis deployment, heard once for the whole process."""

    def __init__(self, client: redis.Redis, channel: str) -> None:
        self.client = client
        self.channel = channel
        self._lock = threading.Lock()
        self._watchers: dict[str, list[threading.Event]] = {}
        self._idle_since = time.monotonic()
        self._thread: threading.Thread | None = None
        self._subscribed = threading.Event()  # replaced whenever the subscription is lost

    def watch(self, turn_id: str, event: threading.Event) -> None:
        """Set ``event`` when a cancel of ``turn_id`` is heard, until ``unwatch``.

        Returns once the feed is subscribed (or after ``SUBSCRIBED_WAIT_S`` if Redis does not
        confirm it): a cancel published from then on is heard, and one published before
        was committed to SQL before it, where the caller reads it next.
        """
        with self._lock:
            self._watchers.setdefault(turn_id, []).append(event)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="cancel-feed", daemon=True)
                self._thread.start()
            subscribed = self._subscribed
        if not subscribed.wait(SUBSCRIBED_WAIT_S):
            log.warning("control channel not subscribed yet; relying on SQL checks")

    def unwatch(self, turn_id: str, event: threading.Event) -> None:
        """Stop telling ``event`` about ``turn_id``."""
        with self._lock:
            events = self._watchers.get(turn_id, [])
            if event in events:
                events.remove(event)
            if not events:
                self._watchers.pop(turn_id, None)
            if not self._watchers:
                self._idle_since = time.monotonic()

    def _heard(self, data: Any) -> None:
        try:
            body = json.loads(data)
        except (TypeError, ValueError):
            return
        if not isinstance(body, dict) or body.get("type") != "cancel":
            return
        with self._lock:
            events = list(self._watchers.get(str(body.get("turn_id")), ()))
        for event in events:
            event.set()

    def _idle(self, idle_s: float) -> bool:
        """True (and the thread is to end) once no turn has watched for ``idle_s``; decided
        under the lock, so a ``watch`` either sees the thread gone or is heard by it."""
        with self._lock:
            if self._watchers or time.monotonic() - self._idle_since < idle_s:
                return False
            self._thread = None
            self._subscribed = threading.Event()
            return True

    def _run(self) -> None:
        failures = 0
        while True:
            client: Any = self.client  # redis-py leaves pubsub() untyped
            pubsub = client.pubsub()
            try:
                pubsub.subscribe(self.channel)
                while True:
                    message = pubsub.get_message(timeout=POLL_S)
                    if message is None:
                        if self._idle(IDLE_S):
                            return
                    elif message.get("type") == "subscribe":
                        self._subscribed.set()
                        failures = 0
                    elif message.get("type") == "message":
                        self._heard(message["data"])
            # Any error, not only Redis's: this thread must not die, or the process hears no
            # cancel again. The pool's ``disconnect`` closing the connection under a read
            # fails redis-py's reader with TypeError or AttributeError (its socket and
            # parser are gone), not with a ConnectionError.
            except Exception as exc:
                with self._lock:
                    if self._subscribed.is_set():
                        self._subscribed = threading.Event()
                if self._idle(0.0):
                    # Nobody to tell (and often the client closed at shutdown): the next
                    # turn's watch subscribes again.
                    log.debug("control channel listener stopped (%s) with no turn watching", exc)
                    return
                failures += 1
                if failures == 1:  # once per outage
                    log.warning("control channel listener failed (%s); resubscribing", exc)
                time.sleep(RETRY_S)
            finally:
                pubsub.close()


# Held weakly: a feed lives while its thread or a turn's watch does (it holds the client,
# so the pool's id is not reused while its feed is here).
_feeds: weakref.WeakValueDictionary[tuple[int, str], CancelFeed] = weakref.WeakValueDictionary()
_feeds_lock = threading.Lock()


def feed_for(client: redis.Redis, channel: str) -> CancelFeed:
    """The process's feed for ``channel`` over ``client``'s connection pool."""
    key = (id(client.connection_pool), channel)
    with _feeds_lock:
        feed = _feeds.get(key)
        if feed is None:
            feed = _feeds[key] = CancelFeed(client, channel)
        return feed


os.register_at_fork(after_in_child=_feeds.clear)  # a child has none of the feeds' threads


class CancelWatch:
    """``with CancelWatch(client, channel, turn_id) as watch: ... watch.is_set()``."""

    def __init__(
        self, client: redis.Redis, channel: str, turn_id: str, *, start_now: bool = True
    ) -> None:
        self.client = client
        self.channel = channel
        self.turn_id = turn_id
        self.start_now = start_now  # False: ``start()`` later, once the turn's first event is out
        self.event = threading.Event()
        self._feed: CancelFeed | None = None

    def is_set(self) -> bool:
        """True once a cancel for this turn was heard (or ``set()`` was called)."""
        return self.event.is_set()

    def set(self) -> None:
        """Mark the turn cancelled (from the committed flag)."""
        self.event.set()

    def start(self) -> None:
        """Start listening (once). Call it before the loop next reads the SQL flag: a cancel
        published before the subscription is then seen there, so none slips through."""
        if self._feed is not None:
            return
        self._feed = feed_for(self.client, self.channel)
        self._feed.watch(self.turn_id, self.event)

    def __enter__(self) -> CancelWatch:
        if self.start_now:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._feed is not None:
            self._feed.unwatch(self.turn_id, self.event)
