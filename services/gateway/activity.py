"""What the conversation list shows beside each title: last activity and what waits on the user."""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from signalbox.services.gateway.conversations import pending_calls
from signalbox.shared.db import Conversation, ToolCall, Turn
from signalbox.shared.statuses import UNFINISHED_TURNS, CallState
from signalbox.shared.timestamps import rfc3339

ACTIVE_TURN_STATUSES = UNFINISHED_TURNS  # a turn that may still emit events


class ConversationActivity(BaseModel):
    """One conversation's last activity and the things waiting on its user."""

    conversation_id: str
    last_activity_at: str
    active_turn_id: str | None
    waiting_decisions: int
    waiting_questions: int


class Activity(BaseModel):
    """Body of ``GET /api/activity``."""

    conversations: list[ConversationActivity]


def _iso(value: datetime) -> str:
    return rfc3339(value)


def activity(session: Session, user_id: str) -> Activity:
    """Every conversation of ``user_id``, most recently active first."""
    conversations = session.scalars(
        select(Conversation).where(
            Conversation.user_id == user_id, Conversation.archived_at.is_(None)
        )
    ).all()
    last_turn: dict[str, datetime] = {
        conversation_id: last
        for conversation_id, last in session.execute(
            select(Turn.conversation_id, func.max(func.coalesce(Turn.finished_at, Turn.created_at)))
            .where(Turn.user_id == user_id)
            .group_by(Turn.conversation_id)
        )
    }
    active: dict[str, str] = {}
    for conversation_id, turn_id in session.execute(
        select(Turn.conversation_id, Turn.id)
        .where(
            Turn.user_id == user_id,
            Turn.parent_call_id.is_(None),
            Turn.status.in_(ACTIVE_TURN_STATUSES),
        )
        .order_by(Turn.seq)
    ):
        active.setdefault(conversation_id, turn_id)
    calls = session.execute(
        select(Turn.conversation_id, ToolCall)
        .join(Turn, ToolCall.turn_id == Turn.id)
        .where(
            Turn.user_id == user_id,
            ToolCall.status.in_((CallState.NEEDS_DECISION, CallState.WAITING)),
        )
    )
    by_conversation: dict[str, list[ToolCall]] = {}
    for conversation_id, call in calls:
        by_conversation.setdefault(conversation_id, []).append(call)
    now = datetime.now(UTC)
    rows = []
    for c in conversations:
        waiting = pending_calls(by_conversation.get(c.id, []), now)
        last = max(filter(None, [c.created_at, last_turn.get(c.id)]), key=_iso)
        rows.append(
            ConversationActivity(
                conversation_id=c.id,
                last_activity_at=_iso(last),
                active_turn_id=active.get(c.id),
                waiting_decisions=len(waiting["pending_decisions"]),
                waiting_questions=len(waiting["pending_questions"]),
            )
        )
    rows.sort(key=lambda r: r.last_activity_at, reverse=True)
    return Activity(conversations=rows)
