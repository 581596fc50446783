"""Conversations and workspaces of a user: create, list, and the detail view of one."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from services.gateway.errors import BadInput, NotFound
from services.gateway.ownership import owned_conversation
from services.gateway.state import Gateway
from shared.db import Conversation, Message, Proposal, ToolCall, Turn, User, Workspace
from shared.ids import new_id
from shared.workspace_paths import check_workspace_name, workspace_dir

TITLE_CHARS = 60  # a new conversation is titled with the start of its first message
DEFAULT_WORKSPACE = "default"  # every user has it (users.selected_workspace starts there)


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.isoformat().replace("+00:00", "Z")


def checked_workspace(name: str) -> str:
    """``name`` if it is a valid workspace name, else ``BadInput`` naming it."""
    try:
        return check_workspace_name(name)
    except ValueError as exc:
        raise BadInput(str(exc)) from None


def ensure_workspace(session: Session, user_id: str, name: str) -> Workspace:
    """The user's workspace row ``name``, created if missing."""
    row = session.scalars(
        select(Workspace).where(Workspace.user_id == user_id, Workspace.name == name)
    ).one_or_none()
    if row is None:
        row = Workspace(id=new_id("ws"), user_id=user_id, name=checked_workspace(name))
        session.add(row)
        session.flush()
    return row


def make_workspace_dir(root: Path, user_id: str, name: str) -> Path:
    """Create the workspace directory if missing (the proposals service writes into it)."""
    path = workspace_dir(root, user_id, name)
    path.mkdir(parents=True, exist_ok=True)
    return path


def conversation_json(conversation: Conversation) -> dict[str, Any]:
    """A conversation as the HTTP API shows it."""
    return {
        "conversation_id": conversation.id,
        "workspace": conversation.workspace,
        "title": conversation.title,
        "created_at": _iso(conversation.created_at),
    }


def create_conversation(
    session: Session, user_id: str, workspace: str | None, title: str
) -> Conversation:
    """A new conversation in ``workspace`` (None: the user's selected one)."""
    if workspace is None:
        user = session.get(User, user_id)
        if user is None:
            raise NotFound(f"user {user_id!r} not found")
        workspace = user.selected_workspace
    ensure_workspace(session, user_id, checked_workspace(workspace))
    conversation = Conversation(
        id=new_id("conv"), user_id=user_id, workspace=workspace, title=title[:200]
    )
    session.add(conversation)
    session.flush()
    return conversation


async def start_conversation(
    gateway: Gateway, user_id: str, workspace: str | None, title: str
) -> Conversation:
    """Create a conversation, its workspace directory, and its ``conversation_created`` event."""
    conversation = await gateway.db(
        lambda session: create_conversation(session, user_id, workspace, title)
    )
    make_workspace_dir(gateway.settings.workspaces_root, user_id, conversation.workspace)
    await gateway.events.append(
        conversation.id,
        "conversation_created",
        {"workspace": conversation.workspace, "title": conversation.title},
    )
    return conversation


def list_conversations(session: Session, user_id: str) -> list[dict[str, Any]]:
    """The user's conversations, newest first."""
    rows = session.scalars(
        select(Conversation)
        .where(Conversation.user_id == user_id)
        .order_by(Conversation.created_at.desc())
    ).all()
    return [conversation_json(c) for c in rows]


def conversation_detail(session: Session, user_id: str, conversation_id: str) -> dict[str, Any]:
    """Turns, transcript, pending tool decisions and proposals of one conversation."""
    conversation = owned_conversation(session, user_id, conversation_id)
    turns = session.scalars(
        select(Turn).where(Turn.conversation_id == conversation.id).order_by(Turn.seq)
    ).all()
    messages = session.scalars(
        select(Message).where(Message.conversation_id == conversation.id).order_by(Message.seq)
    ).all()
    pending = session.scalars(
        select(ToolCall)
        .join(Turn, Turn.id == ToolCall.turn_id)
        .where(Turn.conversation_id == conversation.id, ToolCall.status == "needs_decision")
    ).all()
    proposals = session.scalars(
        select(Proposal)
        .where(Proposal.conversation_id == conversation.id)
        .order_by(Proposal.created_at)
    ).all()
    return {
        **conversation_json(conversation),
        "turns": [
            {
                "turn_id": t.id,
                "seq": t.seq,
                "status": t.status,
                "text": t.text,
                "client_turn_id": t.client_turn_id,
                "cancel_requested": t.cancel_requested,
                "error": t.error,
                "created_at": _iso(t.created_at),
                "finished_at": _iso(t.finished_at),
            }
            for t in turns
        ],
        "messages": [
            {
                "message_id": m.id,
                "turn_id": m.turn_id,
                "seq": m.seq,
                "role": m.role,
                "content": m.content,
                "created_at": _iso(m.created_at),
            }
            for m in messages
        ],
        "pending_decisions": [
            {
                "call_id": c.id,
                "turn_id": c.turn_id,
                "tool": c.tool,
                "input": c.input,
                "expires_at": _iso(c.expires_at),
            }
            for c in pending
        ],
        "proposals": [
            {"proposal_id": p.id, "status": p.status, "summary": p.summary} for p in proposals
        ],
    }


def list_workspaces(session: Session, user_id: str) -> dict[str, Any]:
    """The user's workspaces and which one is selected for new conversations."""
    user = session.get(User, user_id)
    if user is None:
        raise NotFound(f"user {user_id!r} not found")
    names = list(
        session.scalars(
            select(Workspace.name).where(Workspace.user_id == user_id).order_by(Workspace.name)
        ).all()
    )
    for implicit in (DEFAULT_WORKSPACE, user.selected_workspace):
        if implicit not in names:
            names.append(implicit)
    return {
        "workspaces": [{"name": n, "selected": n == user.selected_workspace} for n in names],
        "selected": user.selected_workspace,
    }


def select_workspace(session: Session, user_id: str, name: str) -> str:
    """Make ``name`` (an existing workspace of the user) the one new conversations use."""
    user = session.get(User, user_id)
    if user is None:
        raise NotFound(f"user {user_id!r} not found")
    exists = session.scalars(
        select(Workspace.id).where(Workspace.user_id == user_id, Workspace.name == name)
    ).first()
    if exists is None and name not in (user.selected_workspace, DEFAULT_WORKSPACE):
        raise NotFound(f"workspace {name!r} not found")
    user.selected_workspace = name
    return name
