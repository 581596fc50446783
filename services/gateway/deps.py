"""FastAPI dependencies: the gateway's resources and the authenticated user."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Path
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.requests import HTTPConnection

from signalbox.services.gateway.errors import Forbidden
from signalbox.services.gateway.metrics import user_class
from signalbox.services.gateway.rate_limit import MUTATING_METHODS, action_for_route
from signalbox.services.gateway.state import Gateway
from signalbox.shared.db import User
from signalbox.shared.db.users import user_for_token
from signalbox.shared.ids import ID_MAX_CHARS, ID_PATTERN
from signalbox.shared.log_context import bind_log_context

_bearer = HTTPBearer(auto_error=False)


def get_gateway(connection: HTTPConnection) -> Gateway:
    """The gateway resources built by the lifespan."""
    gateway: Gateway = connection.app.state.gateway
    return gateway


GatewayDep = Annotated[Gateway, Depends(get_gateway)]

# A path parameter naming an object (conversation, turn, tool call, proposal): refused with
# 422 unless it has the form of an id, so no NUL, escape, '..' or over-long text ever
# reaches a lookup or an upstream URL.
IdPath = Annotated[
    str,
    Path(
        pattern=ID_PATTERN,
        max_length=ID_MAX_CHARS,
        description="an id: letters, digits, '_' and '-', at most 40 (else 422)",
    ),
]


async def user_from_token(gateway: Gateway, token: str) -> User | None:
    """The user of a live API token, or None (the token itself is never logged)."""
    return await gateway.read(lambda session: user_for_token(session, token))


async def current_user(
    gateway: GatewayDep,
    connection: HTTPConnection,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> User:
    """The user of the request's ``Authorization: Bearer`` token; 401 otherwise.

    A request that changes something is counted here against the user's rate limit of its
    class (``rate_limit.py``): every mutating route authenticates, so none is left out."""
    user = None
    if credentials is not None and credentials.scheme.lower() == "bearer":
        user = await user_from_token(gateway, credentials.credentials)
    if user is None:
        raise HTTPException(
            status_code=401,
            detail="missing or invalid bearer token",
            headers={"WWW-Authenticate": "Bearer"},
        )
    bind_log_context(user_id=user.id)  # this request's lines (its task ends with it)
    if connection.scope["type"] == "http" and connection.scope["method"] in MUTATING_METHODS:
        route = connection.scope.get("route")
        action = action_for_route(getattr(route, "path", connection.url.path))
        await gateway.limits.hit(action, user.id, user_class(user.is_admin))
    return user


CurrentUser = Annotated[User, Depends(current_user)]


async def admin_user(user: CurrentUser) -> User:
    """The current user if an admin; ``Forbidden`` (403) otherwise. The one admin check:
    ``routes/admin.py`` puts it on its whole router."""
    if not user.is_admin:
        raise Forbidden("this route is for admins only")
    return user


AdminUser = Annotated[User, Depends(admin_user)]
