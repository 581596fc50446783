"""Request dependencies: the service context, who is calling, and the proposal they may see."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, HTTPException, Path, Request
from starlette.status import HTTP_401_UNAUTHORIZED, HTTP_403_FORBIDDEN

from signalbox.services.proposals import decisions, proposals
from signalbox.services.proposals.context import ServiceContext
from signalbox.shared.auth import same_secret
from signalbox.shared.db import Proposal, User
from signalbox.shared.db.users import user_for_token
from signalbox.shared.ids import ID_MAX_CHARS, ID_PATTERN, is_id


def get_context(request: Request) -> ServiceContext:
    """The context ``create_app`` built."""
    ctx: ServiceContext = request.app.state.context
    return ctx


Context = Annotated[ServiceContext, Depends(get_context)]

InternalTokenHeader = Annotated[str | None, Header(alias="X-Signalbox-Internal-Token")]


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(HTTP_401_UNAUTHORIZED, detail, headers={"WWW-Authenticate": "Bearer"})


def require_internal(ctx: Context, token: InternalTokenHeader = None) -> None:
    """Internal routes: the caller must present the deployment's internal token."""
    if token is None:
        raise _unauthorized("missing X-Signalbox-Internal-Token")
    if not same_secret(token, ctx.settings.internal_token):
        raise HTTPException(HTTP_403_FORBIDDEN, "wrong internal token")


def current_user(
    ctx: Context,
    authorization: Annotated[str | None, Header()] = None,
    internal_token: InternalTokenHeader = None,
    acting_for: Annotated[str | None, Header(alias="X-Signalbox-User")] = None,
) -> User:
    """The user of a bearer token, or the user another service acts for with the internal token."""
    with ctx.sessions() as session:
        if internal_token is not None:
            if not same_secret(internal_token, ctx.settings.internal_token) or not (
                acting_for and is_id(acting_for)
            ):
                raise _unauthorized("bad internal credentials")
            user = session.get(User, acting_for)
        elif authorization is not None and authorization.lower().startswith("bearer "):
            user = user_for_token(session, authorization[7:].strip())
        else:
            raise _unauthorized("expected 'Authorization: Bearer <token>'")
    if user is None:
        raise _unauthorized("unknown or revoked credentials")
    return user


CurrentUser = Annotated[User, Depends(current_user)]


# A path parameter naming an object: refused (422) unless it has the form of an id, so no
# NUL, escape or over-long text ever reaches a lookup.
IdPath = Annotated[str, Path(pattern=ID_PATTERN, max_length=ID_MAX_CHARS)]


def owned_proposal(ctx: Context, user: CurrentUser, proposal_id: IdPath) -> Proposal:
    """The proposal ``proposal_id`` if the caller owns it (else 404), expired if overdue."""
    return decisions.expire_if_stale(ctx, proposals.owned(ctx, user.id, proposal_id))


OwnedProposal = Annotated[Proposal, Depends(owned_proposal)]
