"""The ownership check, written once: every object lookup by id goes through here.

An object that does not exist and one that belongs to another user answer the same
``NotFound``, so ids cannot be probed.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Row, select
from sqlalchemy.orm import Session

from signalbox.services.gateway.errors import Conflict, NotFound
from signalbox.shared.db import Alarm, Conversation, Schedule, ToolCall, Turn
from signalbox.shared.db.agents import FoundAgent, find_agent, find_in_scope
from signalbox.shared.db.concurrency import lock_row_returning


def owned_conversation(session: Session, user_id: str, conversation_id: str) -> Conversation:
    """``user_id``'s conversation ``conversation_id``, else ``NotFound``."""
    conversation = session.get(Conversation, conversation_id)
    if conversation is None or conversation.user_id != user_id:
        raise NotFound(f"conversation {conversation_id!r} not found")
    return conversation


# What a turn's submission reads of the conversation it writes into.
_CONVERSATION_TO_WRITE = ("id", "archived_at", "agent_version_id", "agent_name")


def owned_conversation_locked(session: Session, user_id: str, conversation_id: str) -> Row[Any]:
    """``owned_conversation``, held for writing until the transaction ends (``lock_row``),
    in one statement: its ``id``, ``archived_at``, ``agent_version_id`` and ``agent_name``
    as a row, else ``NotFound`` (another user's row is not locked)."""
    row = lock_row_returning(
        session, Conversation, conversation_id, _CONVERSATION_TO_WRITE, {"user_id": user_id}
    )
    if row is None:
        raise NotFound(f"conversation {conversation_id!r} not found")
    return row


def owned_turn(session: Session, user_id: str, turn_id: str) -> Turn:
    """``user_id``'s turn ``turn_id``, else ``NotFound``."""
    turn = session.get(Turn, turn_id)
    if turn is None or turn.user_id != user_id:
        raise NotFound(f"turn {turn_id!r} not found")
    return turn


def owned_tool_call(session: Session, user_id: str, call_id: str) -> tuple[ToolCall, Turn]:
    """``user_id``'s tool call ``call_id`` with its turn, else ``NotFound``."""
    row = session.execute(
        select(ToolCall, Turn)
        .join(Turn, Turn.id == ToolCall.turn_id)
        .where(ToolCall.id == call_id, Turn.user_id == user_id)
    ).one_or_none()
    if row is None:
        raise NotFound(f"tool call {call_id!r} not found")
    return row[0], row[1]


def visible_agent(session: Session, user_id: str, name: str) -> FoundAgent:
    """The agent ``name`` as ``user_id`` sees it (their own, else the deployment's), else
    ``NotFound``: another user's agent is never visible."""
    found = find_agent(session, user_id, name)
    if found is None:
        raise NotFound(f"agent {name!r} not found")
    return found


def owned_agent(session: Session, user_id: str, name: str) -> FoundAgent:
    """``user_id``'s own agent ``name`` to change; a deployment agent is read-only here."""
    found = find_in_scope(session, user_id, name)
    if found is not None:
        return found
    if find_in_scope(session, None, name) is not None:
        raise Conflict(
            f"agent {name!r} is deployment-wide: read-only over the API (an operator changes "
            "it with `signalbox agents edit --deployment`)"
        )
    raise NotFound(f"agent {name!r} not found")


def owned_schedule(session: Session, user_id: str, schedule_id: str) -> Schedule:
    """``user_id``'s schedule ``schedule_id``, else ``NotFound``."""
    schedule = session.get(Schedule, schedule_id)
    if schedule is None or schedule.user_id != user_id:
        raise NotFound(f"schedule {schedule_id!r} not found")
    return schedule


def owned_alarm(session: Session, user_id: str, alarm_id: str) -> Alarm:
    """``user_id``'s alarm ``alarm_id``, else ``NotFound``."""
    alarm = session.get(Alarm, alarm_id)
    if alarm is None or alarm.user_id != user_id:
        raise NotFound(f"alarm {alarm_id!r} not found")
    return alarm
