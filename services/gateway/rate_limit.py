"""Per-user rate limits on every mutating route and frame, by class of action.

The counting is the ``limits`` library's *moving window* on Redis: each hit is kept with
its time for one window, so a user never gets more than the limit in any window-long span
(a fixed window lets twice the limit through across a boundary). The counters live in
Redis, shared by every gateway process: two gateways behind a load balancer give a user
one limit, not two.

Every authenticated HTTP request that changes something is counted once, in
``deps.current_user`` (its class from the route, ``action_for_route``); every WebSocket
frame counts against ``frames`` and, if it acts, against its class too (``FRAME_ACTIONS``).
A route added later is limited as ``writes`` without anyone remembering to.

A frame that acts counts against two classes; ``hit_many`` counts both in one Redis round
trip (one script over the library's own keys and list format, so HTTP requests, counted
by the library, and frames share each window), not one each.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import redis.asyncio as aioredis
from limits import RateLimitItem, parse
from limits.aio.storage import RedisStorage
from limits.aio.strategies import MovingWindowRateLimiter
from redis.commands.core import AsyncScript

from signalbox.services.gateway.errors import RateLimited
from signalbox.services.gateway.metrics import GatewayMetrics
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.settings import GatewaySettings

Action = Literal["frames", "turns", "decisions", "tickets", "uploads", "writes"]

MUTATING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

# The route templates of actions that are not plain creations (``writes``).
ROUTE_ACTIONS: dict[str, Action] = {
    "/api/conversations/{conversation_id}/turns": "turns",
    "/api/agui": "turns",
    "/api/turns/{turn_id}/cancel": "decisions",
    "/api/tool-calls/{call_id}/decision": "decisions",
    "/api/tool-calls/{call_id}/result": "decisions",
    "/api/questions/{question_id}/answer": "decisions",
    "/api/proposals/{proposal_id}/approve": "decisions",
    "/api/proposals/{proposal_id}/reject": "decisions",
    "/api/proposals/{proposal_id}/revert": "decisions",
    "/api/proposals/all": "decisions",
    "/api/ws-tickets": "tickets",
    "/api/uploads": "uploads",
}

# Frames that act (on top of ``frames``, which every frame counts against).
FRAME_ACTIONS: dict[str, Action] = {
    "user_turn": "turns",
    "cancel": "decisions",
    "decide_tool": "decisions",
    "decide_proposal": "decisions",
    "answer": "decisions",
    "tool_result": "decisions",
}


def action_for_route(path_template: str) -> Action:
    """The class of a mutating route, by its template (``writes`` unless listed)."""
    return ROUTE_ACTIONS.get(path_template, "writes")


def limit_items(settings: GatewaySettings) -> dict[Action, RateLimitItem]:
    """Each class's limit, from the settings (``limits`` notation, e.g. ``30/minute``)."""
    return {
        "frames": parse(f"{settings.rate_limit_per_minute}/minute"),
        "turns": parse(settings.rate_limit_turns),
        "decisions": parse(settings.rate_limit_decisions),
        "tickets": parse(settings.rate_limit_tickets),
        "uploads": parse(settings.rate_limit_uploads),
        "writes": parse(settings.rate_limit_writes),
    }


# The library's acquire_moving_window.lua over several windows, in order: each is checked,
# then counted; the first one full ends the script (1-based index), those before it counted,
# as separate hits in that order would. ARGV: the time, then (limit, expiry s) per key.
_HIT_MANY = """
local now = tonumber(ARGV[1])
for i = 1, #KEYS do
    local limit = tonumber(ARGV[2 * i])
    local expiry = tonumber(ARGV[2 * i + 1])
    local entry = redis.call('lindex', KEYS[i], limit - 1)
    if entry and tonumber(entry) >= now - expiry then
        return i
    end
    redis.call('lpush', KEYS[i], now)
    redis.call('ltrim', KEYS[i], 0, limit - 1)
    redis.call('expire', KEYS[i], expiry)
end
return 0
"""


@dataclass
class RateLimits:
    """The limits of one gateway process, counted in the Redis every gateway shares."""

    limiter: MovingWindowRateLimiter
    items: dict[Action, RateLimitItem]
    metrics: GatewayMetrics
    key_prefix: str  # the library's storage prefix (its keys are ``{prefix}:{item key}``)
    hit_script: AsyncScript

    @classmethod
    def build(
        cls,
        client: aioredis.Redis,
        keys: RedisKeys,
        settings: GatewaySettings,
        metrics: GatewayMetrics,
    ) -> RateLimits:
        """Limits on the gateway's own Redis pool (its retries, its blocking pool size); the
        URI only names the implementation, the pool is what connects."""
        key_prefix = f"{keys.prefix}limits"
        storage = RedisStorage(
            "async+redis://",
            implementation="redispy",
            key_prefix=key_prefix,
            connection_pool=client.connection_pool,  # type: ignore[arg-type]
        )
        return cls(
            MovingWindowRateLimiter(storage),
            limit_items(settings),
            metrics,
            key_prefix,
            client.register_script(_HIT_MANY),
        )

    async def hit_many(self, actions: Sequence[Action], user_id: str, user_class: str) -> None:
        """Count one of each of ``actions`` in one round trip, in order; ``RateLimited`` for
        the first that is over (those before it stay counted, as with ``hit`` in turn)."""
        keys: list[str] = []
        args: list[float | int] = [time.time()]
        for action in actions:
            item = self.items[action]
            keys.append(f"{self.key_prefix}:{item.key_for(action, user_id)}")
            args += [item.amount, item.get_expiry()]
        refused = int(await self.hit_script(keys=keys, args=args))
        if refused:
            await self._refuse(actions[refused - 1], user_id, user_class)

    async def hit(self, action: Action, user_id: str, user_class: str) -> None:
        """Count one ``action`` of ``user_id``; ``RateLimited`` (with when to retry) if over."""
        item = self.items[action]
        if await self.limiter.hit(item, action, user_id):
            return
        await self._refuse(action, user_id, user_class)

    async def _refuse(self, action: Action, user_id: str, user_class: str) -> None:
        item = self.items[action]
        self.metrics.rate_limited.labels(user_class, action).inc()
        stats = await self.limiter.get_window_stats(item, action, user_id)
        retry_after_s = max(1, math.ceil(stats.reset_time - time.time()))
        raise RateLimited(
            f"more than {item.amount} {action} per {item.get_expiry()} s; retry in "
            f"{retry_after_s} s",
            retry_after_s,
        )
