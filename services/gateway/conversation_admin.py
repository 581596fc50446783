"""Rename and archive a conversation (the web UI's conversation menu).

Archiving hides a conversation from the lists and refuses new turns (``turns.py``); its
rows, events and proposals stay for audit, and it can still be opened by id and read.
"""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel
from sqlalchemy.orm import Session

from signalbox.services.gateway.ownership import owned_conversation
from signalbox.shared.db import Conversation
from signalbox.shared.timestamps import rfc3339_or_none


class ConversationOut(BaseModel):
    """A conversation after a rename or an archive."""

    conversation_id: str
    workspace: str
    title: str
    archived_at: str | None


def _out(conversation: Conversation) -> ConversationOut:
    return ConversationOut(
        conversation_id=conversation.id,
        workspace=conversation.workspace,
        title=conversation.title,
        archived_at=rfc3339_or_none(conversation.archived_at),
    )


def rename(session: Session, user_id: str, conversation_id: str, title: str) -> ConversationOut:
    """Give ``conversation_id`` a new title."""
    conversation = owned_conversation(session, user_id, conversation_id)
    conversation.title = title
    session.flush()
    return _out(conversation)


def archive(session: Session, user_id: str, conversation_id: str) -> ConversationOut:
    """Archive ``conversation_id`` (again is harmless: the first time is kept)."""
    conversation = owned_conversation(session, user_id, conversation_id)
    if conversation.archived_at is None:
        conversation.archived_at = datetime.now(UTC)
        session.flush()
    return _out(conversation)
