"""Publishing a call's result so that a Redis blip does not lose it.

The result of a call that ran is worth more than the seconds it takes Redis to come back
(a restart, a failover, a dropped connection): without it the orchestrator ends the call
``lost`` and the model is told it may or may not have taken effect. So a publish that
cannot reach Redis is tried again with a growing pause, for up to
``result_publish_retry_s`` in all, then given up with an error in the log.

A retry may add the result twice (the first ``XADD`` got through, its reply did not): the
orchestrator takes the first result of a call and ignores any later one (``gather`` waits
on each call once, and ``store.record_results`` only ends calls still open).
"""

from __future__ import annotations

import logging
import time

import redis
from celery.exceptions import SoftTimeLimitExceeded

from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.tool_contract import ToolResult, publish_result

log = logging.getLogger(__name__)

FIRST_PAUSE_S = 0.1
MAX_PAUSE_S = 2.0  # once Redis is back, a result goes out within this


def publish_retrying(
    client: redis.Redis, keys: RedisKeys, turn_id: str, result: ToolResult, retry_s: float
) -> bool:
    """Publish ``result``, retrying on connection errors for ``retry_s``; False if it never
    got through (the orchestrator then ends the call ``lost`` at its deadline)."""
    deadline = time.monotonic() + retry_s
    pause = FIRST_PAUSE_S
    attempt = 1
    while True:
        try:
            publish_result(client, keys, turn_id, result)
        except (redis.ConnectionError, redis.TimeoutError, SoftTimeLimitExceeded) as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                log.error(
                    "result of call %s not published: Redis unreachable for %g s (%s)",
                    result.call_id,
                    retry_s,
                    exc,
                )
                return False
            log.warning(
                "could not publish the result of call %s (attempt %d: %s); retrying",
                result.call_id,
                attempt,
                exc,
            )
            _pause(min(pause, left))
            pause = min(pause * 2, MAX_PAUSE_S)
            attempt += 1
            continue
        if attempt > 1:
            log.info("published the result of call %s at attempt %d", result.call_id, attempt)
        return True


def _pause(seconds: float) -> None:
    # The call's soft time limit may fire while its finished result waits for Redis: the
    # result is still the one to deliver (the hard limit, just after, ends the process, and
    # the main process then reports the call as timed out).
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            time.sleep(left)
        except SoftTimeLimitExceeded:
            continue
