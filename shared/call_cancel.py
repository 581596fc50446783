"""Which tool calls a cancel means to stop: the contract between the orchestrator's revoke
and the tool worker's signal handler.

Celery's ``revoke(terminate=True)`` signals the pool PROCESS that the worker's main process
last saw running the call. By the time the signal lands, that process may have finished the
call and be running the next one, another tenant's. So the signal only means "look": before
revoking, the orchestrator marks each call cancelled here, and a pool process stops its call
only if the call it runs at that moment is marked (``services/tools/termination.py``).

The signal is ``SIGUSR2``, not ``SIGTERM``: the pool itself sends ``SIGTERM`` to stop its
processes (a cold shutdown), and that must keep stopping an idle process, which a cancel
signal landing late must never do. Celery's pool uses ``SIGUSR1`` (soft time limit) and
``SIGKILL`` (hard limit); ``SIGUSR2`` is free in its children.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from signalbox.shared.redis_clients import sync_client
from signalbox.shared.redis_keys import RedisKeys

CANCEL_SIGNAL = "SIGUSR2"
# The tool workers' control command that signals the batches holding cancelled calls
# (services/tools/batches.py): Celery's revoke finds a batch only by its first call's id.
STOP_BATCHED_CALLS = "stop_batched_calls"
# Long enough for the revoke broadcast to reach every worker and its signal to land
# (milliseconds, seconds under load); a call id is never reused, so a stale mark harms nothing.
CANCELLED_TTL_S = 600
# The check runs inside a signal handler, in the middle of the call it may stop: it must not
# hang there. Past this, the call counts as not cancelled and runs on to its time limit.
CHECK_TIMEOUT_S = 0.5


def mark_cancelled(client: redis.Redis, keys: RedisKeys, call_ids: Sequence[str]) -> None:
    """Mark ``call_ids`` cancelled (one round trip); do it before revoking them."""
    with client.pipeline(transaction=False) as pipe:
        for call_id in call_ids:
            pipe.set(keys.call_cancelled(call_id), b"1", ex=CANCELLED_TTL_S)
        pipe.execute()


def checker_client(redis_url: str) -> redis.Redis:
    """A client for ``is_cancelled`` in a signal handler: its own connection (the handler may
    interrupt the process's other client mid-command), short timeouts, no retries."""
    return sync_client(
        redis_url,
        socket_timeout=CHECK_TIMEOUT_S,
        socket_connect_timeout=CHECK_TIMEOUT_S,
        retry=Retry(NoBackoff(), 0),
    )


def is_cancelled(client: redis.Redis, keys: RedisKeys, call_id: str) -> bool:
    """True if a cancel marked ``call_id``; False too when Redis does not answer in time
    (stopping the wrong tenant's call is worse than running a cancelled one to its limit)."""
    try:
        return bool(client.exists(keys.call_cancelled(call_id)))
    except redis.RedisError:
        return False
