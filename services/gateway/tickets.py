"""Single-use WebSocket tickets: browsers cannot set headers on a WebSocket handshake."""

from __future__ import annotations

import secrets

import redis.asyncio as aioredis

from signalbox.shared.redis_keys import RedisKeys

TICKET_TTL_S = 30  # PROTOCOL.md: a ticket is good for 30 s and one handshake


async def issue_ticket(client: aioredis.Redis, keys: RedisKeys, user_id: str) -> str:
    """A new ticket for ``user_id``."""
    ticket = secrets.token_urlsafe(32)
    await client.set(keys.ws_ticket(ticket), user_id, ex=TICKET_TTL_S)
    return ticket


async def consume_ticket(client: aioredis.Redis, keys: RedisKeys, ticket: str) -> str | None:
    """The user of ``ticket``, deleting it in the same command so it works once; else None."""
    if not ticket or len(ticket) > 200:
        return None
    user_id = await client.getdel(keys.ws_ticket(ticket))
    if user_id is None:
        return None
    return user_id.decode() if isinstance(user_id, bytes) else str(user_id)
