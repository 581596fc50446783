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
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Literal

import redis.asyncio as aioredis
from limits import RateLimitItem, parse
from limits.aio.storage import RedisStorage
from limits.aio.strategies import MovingWindowRateLimiter

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


@dataclass
class RateLimits:
    """The limits of one gateway process, counted in the Redis every gateway shares."""

    limiter: MovingWindowRateLimiter
    items: dict[Action, RateLimitItem]
    metrics: GatewayMetrics

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
        storage = RedisStorage(
            "async+redis://",
            implementation="redispy",
            key_prefix=f"{keys.prefix}limits",
            connection_pool=client.connection_pool,  # type: ignore[arg-type]
        )
        return cls(MovingWindowRateLimiter(storage), limit_items(settings), metrics)

    async def hit(self, action: Action, user_id: str, user_class: str) -> None:
        """Count one ``action`` of ``user_id``; ``RateLimited`` (with when to retry) if over."""
        item = self.items[action]
        if await self.limiter.hit(item, action, user_id):
            return
        self.metrics.rate_limited.labels(user_class, action).inc()
        stats = await self.limiter.get_window_stats(item, action, user_id)
        retry_after_s = max(1, math.ceil(stats.reset_time - time.time()))
        raise RateLimited(
            f"more than {item.amount} {action} per {item.get_expiry()} s; retry in "
            f"{retry_after_s} s",
            retry_after_s,
        )
