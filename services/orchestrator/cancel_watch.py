"""Hear a turn's cancel at once: a thread on the control channel sets an event.

Pub/sub drops messages sent while nobody listens, so the loop also reads the committed
``turns.cancel_requested`` flag at its checkpoints; this only makes the cancel prompt.
"""

from __future__ import annotations

import json
import logging
import threading
from types import TracebackType
from typing import Any

import redis

log = logging.getLogger(__name__)

POLL_S = 0.5  # how often the listener looks at its stop flag between messages


class CancelWatch:
    """``with CancelWatch(client, channel, turn_id) as watch: ... watch.is_set()``."""

    def __init__(
        self, client: redis.Redis, channel: str, turn_id: str, *, start_now: bool = True
    ) -> None:
        self.client = client
        self.channel = channel
        self.turn_id = turn_id
        self.start_now = start_now  # False: ``start()`` later (listening costs a connection)
        self.event = threading.Event()
        self._stop = threading.Event()
        self._pubsub: Any = None
        self._thread: threading.Thread | None = None

    def is_set(self) -> bool:
        """True once a cancel for this turn was heard (or ``set()`` was called)."""
        return self.event.is_set()

    def set(self) -> None:
        """Mark the turn cancelled (from the committed flag)."""
        self.event.set()

    def _listen(self) -> None:
        try:
            self._read_until_stopped()
        finally:
            self._pubsub.close()  # here, not in __exit__: the reader owns the connection

    def _read_until_stopped(self) -> None:
        while not self._stop.is_set():
            try:
                message = self._pubsub.get_message(ignore_subscribe_messages=True, timeout=POLL_S)
            except (redis.RedisError, ValueError):
                if not self._stop.is_set():
                    log.warning("control channel listener failed; relying on SQL checks")
                return
            if not message or message.get("type") != "message":
                continue
            try:
                body = json.loads(message["data"])
            except (TypeError, ValueError):
                continue
            if (
                isinstance(body, dict)
                and body.get("type") == "cancel"
                and body.get("turn_id") == self.turn_id
            ):
                self.event.set()

    def start(self) -> None:
        """Start listening (once). Call it before the loop next reads the SQL flag: a cancel
        published before the subscription is then seen there, so none slips through."""
        if self._thread is not None:
            return
        client: Any = self.client  # redis-py leaves pubsub() untyped
        self._pubsub = client.pubsub()
        self._pubsub.subscribe(self.channel)
        self._thread = threading.Thread(target=self._listen, name="cancel-watch", daemon=True)
        self._thread.start()

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
        # Not joined: the listener notices within POLL_S and closes its connection itself,
        # so ending a turn never waits on it.
        self._stop.set()
