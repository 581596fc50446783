"""Two workarounds in kombu's Redis transport: a worker killed when Redis goes away
mid-task, and a Redis client built for every command it sends.

**A worker killed when Redis goes away mid-task.**

Celery 5.7 (``Consumer.on_connection_error_after_connected``) first ``collect()``s the lost
broker connection, which drops its transport, then ``close()``s it. Closing the channel
restores the messages this worker had taken but not yet acknowledged (acks_late), and
building a Redis client for that on the dropped transport raises ``AttributeError``
(``'NoneType' object has no attribute 'hostname'``). It is not a connection error, so it
escapes, and the whole worker exits with "Unrecoverable error" instead of reconnecting.
Any worker busy with a task when Redis restarts dies that way (tests/chaos proves it).

The same dropped transport fails again when a task that was running at the loss finishes
and is acknowledged (or rejected) on its old channel: in a prefork worker that runs in the
event loop, and the worker exits the same way.

The fix lets those calls give up quietly: the messages stay in Redis' unacked index
(restored by the visibility timeout, and a redelivered turn or call is guarded by its lease
or claim) or were lost with Redis' data (the orchestrators' reconciler re-enqueues their
turns from SQL), and the worker goes on with its new connection.

**A Redis client built for every command.** kombu's ``Channel.conn_or_acquire`` builds a new
``redis.Redis`` on the channel's connection pool each time it is asked for one: for every
message published, every delivery recorded in the unacked index and every acknowledgement.
Building one costs as much CPU as a round trip to Redis (about 60 µs: redis-py fills a
table of some 200 response callbacks per client), and it was 15% of a tool worker's main
process in a profile of ``load@200``. A client holds no connection of its own (its pool
does, and lends one per command), so one client per channel and pool serves them all: the
fix keeps it on the channel and builds a new one when the channel's pool is replaced (kombu
drops a channel's pools after a fork, when its first ping fails and when it closes; a
reconnection makes a new channel). Reaching ``channel.pool`` still raises on a dropped
transport, as before, so the first workaround above sees the same error.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual

log = logging.getLogger(__name__)

_PATCHED = "_signalbox_patched"
_CLIENT = "_signalbox_client"  # the channel's one client for conn_or_acquire


def apply() -> None:
    """Install both workarounds (idempotent)."""
    _reuse_channel_client()
    qos: Any = kombu_redis.QoS
    if getattr(qos, _PATCHED, False):
        return
    original = qos.restore_unacked

    def restore_unacked(self: Any, client: Any = None) -> Any:
        try:
            return original(self, client)
        except AttributeError as exc:  # the transport was already collected: see above
            log.warning(
                "could not restore %d unacknowledged message(s) after losing Redis (%s); "
                "the visibility timeout or the turn reconciler brings them back",
                len(self._delivered),
                exc,
            )
            self._delivered.clear()
            return None

    original_ack = qos.ack
    original_reject = qos.reject

    def ack(self: Any, delivery_tag: Any) -> None:
        try:
            original_ack(self, delivery_tag)
        except AttributeError:
            _forget(self, delivery_tag, "acknowledge")

    def reject(self: Any, delivery_tag: Any, requeue: bool = False) -> None:
        try:
            original_reject(self, delivery_tag, requeue=requeue)
        except AttributeError:
            _forget(self, delivery_tag, "reject")

    qos.restore_unacked = restore_unacked
    qos.ack = ack
    qos.reject = reject
    setattr(qos, _PATCHED, True)


def _forget(qos: Any, delivery_tag: Any, what: str) -> None:
    """Drop a delivery of a channel whose connection is gone (only local bookkeeping)."""
    log.warning("could not %s a message of a lost Redis connection; it is left to Redis", what)
    virtual.QoS.ack(qos, delivery_tag)


def _reuse_channel_client() -> None:
    channel: Any = kombu_redis.Channel
    if getattr(channel, _PATCHED, False):
        return

    @contextlib.contextmanager
    def conn_or_acquire(self: Any, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
            return
        pool = self.pool  # raises as kombu's own did when the transport was dropped
        kept = self.__dict__.get(_CLIENT)
        if kept is None or kept.connection_pool is not pool:
            kept = self._create_client()
            self.__dict__[_CLIENT] = kept
        yield kept

    channel.conn_or_acquire = conn_or_acquire
    setattr(channel, _PATCHED, True)
