"""``GET /ws``: the handshake (origin, then bearer token or single-use ticket) before accept."""

from __future__ import annotations

from urllib.parse import urlsplit

from fastapi import APIRouter, WebSocket

from signalbox.services.gateway.deps import get_gateway, user_from_token
from signalbox.services.gateway.metrics import user_class
from signalbox.services.gateway.state import Gateway
from signalbox.services.gateway.tickets import consume_ticket
from signalbox.services.gateway.ws_session import WsSession
from signalbox.shared.log_context import bind_log_context

router = APIRouter()

POLICY_VIOLATION = 1008  # closing before accept: uvicorn answers the handshake with HTTP 403


def origin_allowed(origin: str | None, host: str | None, allowed: list[str]) -> bool:
    """No Origin (not a browser), a listed origin, or the gateway's own host."""
    if origin is None:
        return True
    normalised = origin.rstrip("/").lower()
    if normalised in {a.rstrip("/").lower() for a in allowed}:
        return True
    # Same host as the request: the gateway's own web UI. A cross-site page cannot make a
    # browser send a Host of the gateway with an Origin of the gateway.
    netloc = urlsplit(normalised).netloc
    return bool(host) and netloc == (host or "").lower()


async def handshake_user(gateway: Gateway, websocket: WebSocket) -> tuple[str, str | None] | None:
    """The user id of a bearer header or a ticket (consumed), and the user's class when the
    user was read (a bearer token's), else None."""
    authorization = websocket.headers.get("authorization")
    if authorization:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        user = await user_from_token(gateway, token.strip())
        return (user.id, user_class(user.is_admin)) if user is not None else None
    ticket = websocket.query_params.get("ticket")
    if ticket:
        user_id = await consume_ticket(gateway.redis, gateway.keys, ticket)
        return (user_id, None) if user_id is not None else None
    return None


@router.websocket("/ws")
async def websocket_endpoint(websocket: WebSocket) -> None:
    """Authenticate, accept, and run one session until the socket closes."""
    gateway = get_gateway(websocket)
    origin = websocket.headers.get("origin")
    if not origin_allowed(origin, websocket.headers.get("host"), gateway.settings.allowed_origins):
        await websocket.close(code=POLICY_VIOLATION)
        return
    user = await handshake_user(gateway, websocket)
    if user is None:
        await websocket.close(code=POLICY_VIOLATION)
        return
    user_id, known_class = user
    bind_log_context(user_id=user_id)  # every line of this socket's task
    await websocket.accept()
    connections = gateway.metrics.connections.labels("ws")
    connections.inc()
    try:
        await WsSession(gateway, websocket, user_id, known_class).run()
    finally:
        connections.dec()
