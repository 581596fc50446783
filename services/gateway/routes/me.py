"""Who the bearer token belongs to: the web UI shows it and tells "token rejected" apart."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from services.gateway.deps import CurrentUser

router = APIRouter(prefix="/api/me")


class Me(BaseModel):
    """The authenticated user."""

    user_id: str
    name: str
    selected_workspace: str


@router.get("", response_model=Me)
async def me(user: CurrentUser) -> Me:
    """The user of this token (401 when the token is missing, wrong or revoked)."""
    return Me(user_id=user.id, name=user.name, selected_workspace=user.selected_workspace)
