"""``PATCH`` (rename) and ``DELETE`` (archive) of ``/api/conversations/{id}``."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

from signalbox.services.gateway import conversation_admin
from signalbox.services.gateway.conversation_admin import ConversationOut
from signalbox.services.gateway.deps import CurrentUser, GatewayDep, IdPath
from signalbox.shared.protocol import NO_NUL

router = APIRouter(prefix="/api/conversations")


class Rename(BaseModel):
    """Body of ``PATCH /api/conversations/{id}``."""

    title: str = Field(min_length=1, max_length=200, pattern=NO_NUL)


@router.patch("/{conversation_id}", response_model=ConversationOut)
async def rename(
    conversation_id: IdPath, body: Rename, user: CurrentUser, gateway: GatewayDep
) -> ConversationOut:
    """Rename my conversation."""
    title = body.title.strip() or body.title
    return await gateway.db(lambda s: conversation_admin.rename(s, user.id, conversation_id, title))


@router.delete("/{conversation_id}", response_model=ConversationOut)
async def archive(
    conversation_id: IdPath, user: CurrentUser, gateway: GatewayDep
) -> ConversationOut:
    """Archive my conversation: hidden from lists, no new turns; events and proposals kept."""
    return await gateway.db(lambda s: conversation_admin.archive(s, user.id, conversation_id))
