"""Per-user frame rate limit over fixed one-minute windows in Redis (shared by all gateways)."""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from shared.redis_keys import RedisKeys

WINDOW_S = 60


async def allow(client: aioredis.Redis, keys: RedisKeys, user_id: str, per_minute: int) -> bool:
    """Count one request of ``user_id``; False once the current window is over ``per_minute``."""
    window = int(time.time()) // WINDOW_S
    key = keys.rate(user_id, window)
    pipe = client.pipeline(transaction=False)
    pipe.incr(key)
    pipe.expire(key, WINDOW_S * 2)
    count, _ = await pipe.execute()
    return int(count) <= per_minute
