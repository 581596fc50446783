"""The poison-message bound: how many runs of a turn started and never came back.

``acks_late`` + ``task_reject_on_worker_lost`` (and the reconciler) deliver a turn again
after its worker dies, which is what makes turns survive crashes, and also what would make a
turn that kills its worker every time (a bug, a model answer that crashes the process) kill
every orchestrator forever. So each run that takes the lease counts itself in Redis and
uncounts itself when it returns, whatever the outcome; a run that finds the count past
``max_turn_deliveries`` fails the turn with a clear error instead of running it.

Only runs that took the lease count: a redelivery that finds the turn leased did nothing,
and a parked turn woken many times by answers ends each run normally.
"""

from __future__ import annotations

import logging

import redis

from signalbox.services.orchestrator.lease import TurnLease
from signalbox.shared.redis_keys import RedisKeys

log = logging.getLogger(__name__)

COUNTER_TTL_S = 24 * 3600  # a turn nobody delivers again for a day starts from zero


def count_start(client: redis.Redis, keys: RedisKeys, turn_id: str) -> int:
    """Count one run of ``turn_id`` that starts now; returns how many are not back."""
    pipe = client.pipeline()
    pipe.incr(keys.turn_deliveries(turn_id))
    pipe.expire(keys.turn_deliveries(turn_id), COUNTER_TTL_S)
    count, _ = pipe.execute()
    return int(count)


def lease_and_count(lease: TurnLease, keys: RedisKeys, turn_id: str) -> int:
    """Take the turn's lease and count the run that starts now, in one round trip: how
    many runs are not back, or 0 if another runner holds the lease (nothing counted). The
    count is forgotten when the lease is released (the run came back, any outcome)."""
    return lease.acquire_counted(keys.turn_deliveries(turn_id), COUNTER_TTL_S)


def count_return(client: redis.Redis, keys: RedisKeys, turn_id: str) -> None:
    """The run came back (any outcome): the turn is not poison, forget the count."""
    try:
        client.delete(keys.turn_deliveries(turn_id))
    except redis.RedisError:
        # Redis away: the count stays, at worst one extra crash-free run is counted.
        log.warning("could not clear the delivery count of turn %s", turn_id)


def given_up_error(count: int, limit: int) -> str:
    """The ``turn_finished`` error of a turn given up as poison."""
    return (
        f"given up after {count - 1} deliveries: each run of this turn ended with its "
        f"orchestrator dying (limit SIGNALBOX_MAX_TURN_DELIVERIES={limit})"
    )
