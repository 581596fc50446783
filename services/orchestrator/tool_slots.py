"""Per-user limit on tool calls in flight (``SIGNALBOX_MAX_TOOL_CALLS_PER_USER``).

A call sent to a tool worker holds one of its user's slots from dispatch until it ends;
the slots are a sorted set per user in Redis (member: call id, score: the call's deadline),
taken and counted in one Lua step, so the orchestrators of every machine share one count.
A call that cannot get a slot stays ``pending`` in SQL and its runner sends it as slots
free (``turn_runner._settle``). A slot whose runner died is dropped at its call's deadline;
a call that ends gives its slot back at once (``TurnRunner.finished``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import redis

from signalbox.shared.redis_keys import RedisKeys

# KEYS[1]: the user's slots; ARGV: now, limit, then (call id, deadline) pairs in the order
# they should be served. A call that holds a slot already keeps it (a resumed runner).
_TAKE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local held = redis.call('ZCARD', KEYS[1])
local limit = tonumber(ARGV[2])
local granted = {}
local latest = 0
for i = 3, #ARGV, 2 do
  local call, deadline = ARGV[i], tonumber(ARGV[i + 1])
  if redis.call('ZSCORE', KEYS[1], call) then
    table.insert(granted, call)
  elseif held < limit then
    redis.call('ZADD', KEYS[1], deadline, call)
    held = held + 1
    table.insert(granted, call)
  end
  if deadline > latest then latest = deadline end
end
-- The set outlives its latest deadline by a second, never longer (no GT: Redis 6 too).
local ttl = redis.call('TTL', KEYS[1])
if ttl == -1 or (ttl >= 0 and tonumber(ARGV[1]) + ttl < latest) then
  redis.call('EXPIREAT', KEYS[1], math.ceil(latest) + 1)
end
return granted
"""


class ToolSlots:
    """The tool-call slots of every user of one deployment."""

    def __init__(self, client: redis.Redis, keys: RedisKeys, limit: int) -> None:
        self.client = client
        self.keys = keys
        self.limit = limit  # 0: no limit, and nothing is stored
        self._take: Any = client.register_script(_TAKE)

    def take(self, user_id: str, calls: Sequence[tuple[str, float]]) -> set[str]:
        """The ids among ``calls`` ((call id, deadline as epoch seconds), in the order they
        should be served) that hold a slot now."""
        if not self.limit or not calls:
            return {call_id for call_id, _deadline in calls}
        args: list[Any] = [time.time(), self.limit]
        for call_id, deadline in calls:
            args += [call_id, deadline]
        granted = self._take(keys=[self.keys.user_tool_slots(user_id)], args=args)
        return {g.decode() if isinstance(g, bytes) else str(g) for g in granted}

    def give_back(self, user_id: str, call_ids: Sequence[str]) -> None:
        """Free the slots of calls that ended."""
        if self.limit and call_ids:
            self.client.zrem(self.keys.user_tool_slots(user_id), *call_ids)
