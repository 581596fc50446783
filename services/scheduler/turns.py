"""Starting a turn on the owner's behalf: the scheduler's one way into a conversation.

The same rows and events the gateway writes for a typed message (``turn_queued``, then
``orchestrator.run_turn``), with a ``client_turn_id`` naming the schedule tick or alarm: the
turns table's unique (conversation, client_turn_id) makes a repeated tick find its turn
instead of starting a second one, and the id marks the turn as scheduled in every view.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from signalbox.shared.db import Conversation, Turn, User
from signalbox.shared.db.agents import find_agent
from signalbox.shared.db.concurrency import lock_row
from signalbox.shared.ids import new_id
from signalbox.shared.statuses import TurnState

TITLE_CHARS = 80


class CannotStart(Exception):
    """The turn cannot start: its conversation or agent is gone, or archived."""


@dataclass(frozen=True)
class StartedTurn:
    """A turn stored ``queued``; ``new_conversation`` when this start opened one."""

    conversation: Conversation
    turn_id: str
    created: bool
    new_conversation: bool
    client_turn_id: str  # ``schedule:<id>:<tick>`` / ``alarm:<id>``: where it came from


def _new_conversation(
    session: Session, user_id: str, workspace: str | None, title: str, agent: str | None
) -> Conversation:
    user = session.get(User, user_id)
    if user is None:
        raise CannotStart(f"user {user_id!r} is gone")
    conversation = Conversation(
        id=new_id("conv"),
        user_id=user_id,
        workspace=workspace or user.selected_workspace,
        title=title[:TITLE_CHARS],
    )
    if agent is not None:
        found = find_agent(session, user_id, agent)
        if found is not None:
            conversation.agent_version_id = found.version.id
            conversation.agent_name = found.agent.name
            conversation.agent_version = found.version.version
        elif agent != "default":
            raise CannotStart(f"agent {agent!r} no longer exists")
    session.add(conversation)
    session.flush()
    return conversation


def store_turn(
    session: Session,
    user_id: str,
    conversation_id: str | None,
    text: str,
    client_turn_id: str,
    *,
    deployment: str,
    workspace: str | None = None,
    agent: str | None = None,
) -> StartedTurn:
    """Store a queued turn (in a new conversation when ``conversation_id`` is None).

    ``deployment`` (the Redis prefix whose queues run it) is stored as the gateway stores it:
    an admission pass sees only its own deployment's waiting turns, so a turn stored without
    one and sent while an earlier turn of its conversation still ran was never admitted
    when that turn ended (it stayed ``queued`` for good)."""
    new = conversation_id is None
    if conversation_id is None:
        conversation = _new_conversation(session, user_id, workspace, text, agent)
    else:
        found = session.get(Conversation, conversation_id)
        if found is None or found.user_id != user_id or found.archived_at is not None:
            raise CannotStart(f"conversation {conversation_id!r} is gone or archived")
        conversation = found
        lock_row(session, Conversation, conversation.id)
        existing = session.scalars(
            select(Turn).where(
                Turn.conversation_id == conversation.id, Turn.client_turn_id == client_turn_id
            )
        ).first()
        if existing is not None:
            return StartedTurn(
                conversation, existing.id, created=False, new_conversation=False,
                client_turn_id=client_turn_id,
            )  # fmt: skip
    last_seq = session.scalar(
        select(func.max(Turn.seq)).where(Turn.conversation_id == conversation.id)
    )
    turn = Turn(
        id=new_id("turn"),
        conversation_id=conversation.id,
        user_id=user_id,
        seq=(last_seq or 0) + 1,
        text=text,
        client_turn_id=client_turn_id,
        status=TurnState.QUEUED,
        deployment=deployment,
    )
    session.add(turn)
    session.flush()
    return StartedTurn(
        conversation, turn.id, created=True, new_conversation=new, client_turn_id=client_turn_id
    )
