"""A workaround for a kombu/Celery bug that kills a worker when Redis goes away mid-task.

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
"""

from __future__ import annotations

import logging
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual

log = logging.getLogger(__name__)

_PATCHED = "_signalbox_patched"


def apply() -> None:
    """Install the workaround (idempotent)."""
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
