"""Who may read a conversation's Server-Sent Events: a bearer token, or a browser's ticket.

A browser's ``EventSource`` cannot send an ``Authorization`` header, so it opens
``/stream?ticket=...`` with a single-use ticket from ``POST /api/ws-tickets``. The first
request consumes the ticket (``GETDEL``, as ``/ws`` does): the ticket never authenticates
anything else again. But an ``EventSource`` that loses its connection reconnects by itself,
to the same URL, with a ``Last-Event-ID`` header: so consuming the ticket leaves a *resume
grant* under the ticket's hash, bound to that user and that one conversation, that accepts
exactly those reconnects (a request with ``Last-Event-ID``) for ``RESUME_WINDOW_S`` after
the stream was last open. It reads events the ticket's user could already read; it opens
no socket, no other conversation and no other route.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from fastapi import HTTPException
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from signalbox.services.gateway.deps import user_from_token
from signalbox.services.gateway.ownership import owned_conversation
from signalbox.services.gateway.state import Gateway
from signalbox.services.gateway.tickets import consume_ticket
from signalbox.shared.auth import hash_token

RESUME_WINDOW_S = 120  # a browser retries within seconds; two minutes covers a gateway restart
_REFRESH_EVERY_S = RESUME_WINDOW_S / 4  # while the stream is open, the grant is kept alive

bearer_scheme = HTTPBearer(auto_error=False)


def _unauthorised() -> HTTPException:
    return HTTPException(
        status_code=401,
        detail="missing or invalid bearer token or ticket",
        headers={"WWW-Authenticate": "Bearer"},
    )


@dataclass
class StreamAccess:
    """The reader of one stream; ``grant_key`` is set when it came with a ticket."""

    user_id: str
    grant_key: str | None = None
    _refreshed_at: float = field(default_factory=time.monotonic)

    async def keep_alive(self, gateway: Gateway) -> None:
        """Push the resume grant's expiry on while the stream is open (at most every 30 s)."""
        if self.grant_key is None or time.monotonic() - self._refreshed_at < _REFRESH_EVERY_S:
            return
        self._refreshed_at = time.monotonic()
        await gateway.redis.expire(self.grant_key, RESUME_WINDOW_S)


def _grant_value(user_id: str, conversation_id: str) -> str:
    return f"{user_id} {conversation_id}"


async def stream_access(
    gateway: Gateway,
    conversation_id: str,
    credentials: HTTPAuthorizationCredentials | None,
    ticket: str | None,
    resuming: bool,
) -> StreamAccess:
    """The reader of ``conversation_id``'s stream, ownership checked; 401 or ``NotFound``.

    ``resuming`` is True when the request carries ``Last-Event-ID``: only then may a ticket
    already consumed be accepted again, through its resume grant.
    """
    access: StreamAccess | None = None
    if credentials is not None:
        user = None
        if credentials.scheme.lower() == "bearer":
            user = await user_from_token(gateway, credentials.credentials)
        if user is not None:
            access = StreamAccess(user.id)
    elif ticket:
        access = await _ticket_access(gateway, conversation_id, ticket, resuming)
    if access is None:
        raise _unauthorised()
    await gateway.db(lambda s: owned_conversation(s, access.user_id, conversation_id))
    if access.grant_key is not None:
        await gateway.redis.set(
            access.grant_key, _grant_value(access.user_id, conversation_id), ex=RESUME_WINDOW_S
        )
    return access


async def _ticket_access(
    gateway: Gateway, conversation_id: str, ticket: str, resuming: bool
) -> StreamAccess | None:
    grant_key = gateway.keys.sse_resume(hash_token(ticket))
    user_id = await consume_ticket(gateway.redis, gateway.keys, ticket)
    if user_id is not None:
        return StreamAccess(user_id, grant_key)
    if not resuming:
        return None
    raw = await gateway.redis.get(grant_key)
    if raw is None:
        return None
    user_id, _, granted = (raw.decode() if isinstance(raw, bytes) else str(raw)).partition(" ")
    if granted != conversation_id:
        return None
    return StreamAccess(user_id, grant_key)
