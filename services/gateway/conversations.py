"""Conversations of a user: create, list, and the detail view of one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from signalbox.services.gateway.agents import bind_agent
from signalbox.services.gateway.errors import NotFound
from signalbox.services.gateway.ownership import owned_conversation
from signalbox.services.gateway.quotas import Quotas
from signalbox.services.gateway.state import Gateway
from signalbox.services.gateway.workspaces import (
    checked_workspace,
    ensure_workspace,
    make_workspace_dir,
)
from signalbox.shared.db import Conversation, Message, Proposal, ToolCall, Turn, User
from signalbox.shared.ids import new_id
from signalbox.shared.statuses import CallState, Executor
from signalbox.shared.timestamps import rfc3339_or_none

TITLE_CHARS = 60  # a new conversation is titled with the start of its first message


def _iso(value: datetime | None) -> str | None:
    return rfc3339_or_none(value)


def conversation_json(conversation: Conversation) -> dict[str, Any]:
    """A conversation as the HTTP API shows it."""
    return {
        "conversation_id": conversation.id,
        "workspace": conversation.workspace,
        "title": conversation.title,
        "created_at": _iso(conversation.created_at),
        "agent": conversation.agent_name,
        "agent_version": conversation.agent_version,
    }


def create_conversation(
    session: Session,
    user_id: str,
    workspace: str | None,
    title: str,
    agent: str | None = None,
    quotas: Quotas | None = None,
) -> Conversation:
    """A new conversation in ``workspace`` (None: the user's selected one), bound to the
    newest version of ``agent`` (None: the deployment's default agent); with ``quotas``,
    refused (``QuotaExceeded``, nothing written) past the user's conversations or
    workspaces."""
    if workspace is None:
        user = session.get(User, user_id)
        if user is None:
            raise NotFound(f"user {user_id!r} not found")
        workspace = user.selected_workspace
    if quotas is not None:
        quotas.reserve(session, user_id, "conversations")
        quotas.reserve_workspace(session, user_id, checked_workspace(workspace))
    ensure_workspace(session, user_id, checked_workspace(workspace))
    conversation = Conversation(
        id=new_id("conv"), user_id=user_id, workspace=workspace, title=title[:200]
    )
    if agent is not None:
        bind_agent(session, user_id, conversation, agent)
    session.add(conversation)
    session.flush()
    return conversation


async def announce_conversation(gateway: Gateway, conversation: Conversation) -> None:
    """Make a stored conversation's workspace directory and append ``conversation_created``."""
    make_workspace_dir(
        gateway.settings.workspaces_root, conversation.user_id, conversation.workspace
    )
    data = conversation_created_data(conversation)
    await gateway.events.append(conversation.id, "conversation_created", data)


def conversation_created_data(conversation: Conversation) -> dict[str, Any]:
    """The data of a stored conversation's ``conversation_created`` event."""
    data: dict[str, Any] = {"workspace": conversation.workspace, "title": conversation.title}
    if conversation.agent_name is not None:  # bound to an agent, not the default
        data.update(agent=conversation.agent_name, agent_version=conversation.agent_version)
    return data


async def start_conversation(
    gateway: Gateway, user_id: str, workspace: str | None, title: str, agent: str | None = None
) -> Conversation:
    """Create a conversation, its workspace directory, and its ``conversation_created`` event."""
    conversation = await gateway.db(
        lambda session: create_conversation(
            session, user_id, workspace, title, agent, gateway.quotas
        )
    )
    await announce_conversation(gateway, conversation)
    return conversation


def list_conversations(session: Session, user_id: str) -> list[dict[str, Any]]:
    """The user's conversations, newest first."""
    rows = session.scalars(
        select(Conversation)
        .where(Conversation.user_id == user_id, Conversation.archived_at.is_(None))
        .order_by(Conversation.created_at.desc())
    ).all()
    return [conversation_json(c) for c in rows]


ASK_USER = "ask_user"  # the orchestrator's built-in question tool
CLIENT_EXECUTOR = Executor.CLIENT  # ToolCall.executor of a tool the user's client runs


def _turn_json(turn: Turn) -> dict[str, Any]:
    return {
        "turn_id": turn.id,
        "seq": turn.seq,
        "status": turn.status,
        "text": turn.text,
        "client_turn_id": turn.client_turn_id,
        "cancel_requested": turn.cancel_requested,
        "error": turn.error,
        "created_at": _iso(turn.created_at),
        "finished_at": _iso(turn.finished_at),
        "parent_call_id": turn.parent_call_id,
        "sub_agents": [],
    }


def nest_turns(turns: Sequence[Turn], call_turn: Mapping[str, str]) -> list[dict[str, Any]]:
    """Top-level turns, each child (spawn_agent) turn under the turn that made its call.

    ``call_turn`` maps a call id to its turn id. A child whose parent cannot be found stays
    at the top level, still flagged by its ``parent_call_id``, rather than disappear.
    """
    by_id = {t.id: _turn_json(t) for t in turns}
    top: list[dict[str, Any]] = []
    for turn in turns:
        item = by_id[turn.id]
        parent = by_id.get(call_turn.get(turn.parent_call_id or "", ""))
        if turn.parent_call_id is not None and parent is not None and parent is not item:
            parent["sub_agents"].append(item)
        else:
            top.append(item)
    return top


def _unexpired(call: ToolCall, now: datetime) -> bool:
    if call.expires_at is None:
        return True
    expires = call.expires_at if call.expires_at.tzinfo else call.expires_at.replace(tzinfo=UTC)
    return expires > now


def pending_calls(calls: Sequence[ToolCall], now: datetime) -> dict[str, list[dict[str, Any]]]:
    """The calls someone can still act on, by what they wait for.

    A decision already recorded, or a wait past its ``expires_at``, is not pending: acting
    on it would be refused, and the orchestrator ends it on its next look.
    """
    decisions, questions, client_tools = [], [], []
    for c in calls:
        if not _unexpired(c, now):
            continue
        if c.status == CallState.NEEDS_DECISION and c.decision is None:
            decisions.append(
                {
                    "call_id": c.id,
                    "turn_id": c.turn_id,
                    "tool": c.tool,
                    "input": c.input,
                    "expires_at": _iso(c.expires_at),
                }
            )
        elif c.status == CallState.WAITING and c.tool == ASK_USER and c.executor != CLIENT_EXECUTOR:
            options = c.input.get("options")
            questions.append(
                {
                    "question_id": c.id,
                    "turn_id": c.turn_id,
                    "text": str(c.input.get("question", "")),
                    "options": options if isinstance(options, list) else None,
                    "expires_at": _iso(c.expires_at),
                }
            )
        elif c.status in (CallState.WAITING, CallState.RUNNING) and c.executor == CLIENT_EXECUTOR:
            client_tools.append(
                {
                    "call_id": c.id,
                    "turn_id": c.turn_id,
                    "tool": c.tool,
                    "input": c.input,
                    "timeout_s": c.timeout_s,
                    "expires_at": _iso(c.expires_at),
                }
            )
    return {
        "pending_decisions": decisions,
        "pending_questions": questions,
        "pending_client_tools": client_tools,
    }


def conversation_detail(session: Session, user_id: str, conversation_id: str) -> dict[str, Any]:
    """Turns (sub-agents nested), transcript, what waits for the human, and proposals."""
    conversation = owned_conversation(session, user_id, conversation_id)
    turns = session.scalars(
        select(Turn)
        .where(Turn.conversation_id == conversation.id)
        .order_by(Turn.seq, Turn.created_at)
    ).all()
    messages = session.scalars(
        select(Message).where(Message.conversation_id == conversation.id).order_by(Message.seq)
    ).all()
    child_of = {t.id: t.parent_call_id for t in turns if t.parent_call_id is not None}
    parent_calls = set(child_of.values())
    rows = session.execute(
        select(ToolCall.id, ToolCall.turn_id).where(ToolCall.id.in_(parent_calls))
    ).all()
    call_turn = {call_id: turn_id for call_id, turn_id in rows}
    open_calls = session.scalars(
        select(ToolCall)
        .join(Turn, Turn.id == ToolCall.turn_id)
        .join(Message, Message.id == ToolCall.message_id)
        .where(
            Turn.conversation_id == conversation.id,
            ToolCall.status.in_((CallState.NEEDS_DECISION, CallState.WAITING, CallState.RUNNING)),
        )
        .order_by(Message.seq, ToolCall.position)
    ).all()
    proposals = session.scalars(
        select(Proposal)
        .where(Proposal.conversation_id == conversation.id)
        .order_by(Proposal.created_at)
    ).all()
    return {
        **conversation_json(conversation),
        "turns": nest_turns(turns, call_turn),
        "messages": [
            {
                "message_id": m.id,
                "turn_id": m.turn_id,
                # Set on a sub-agent's messages: they are not the conversation's own transcript.
                "parent_call_id": child_of.get(m.turn_id),
                "seq": m.seq,
                "role": m.role,
                "content": m.content,
                "created_at": _iso(m.created_at),
            }
            for m in messages
        ],
        **pending_calls(open_calls, datetime.now(UTC)),
        "proposals": [
            {"proposal_id": p.id, "status": p.status, "summary": p.summary} for p in proposals
        ],
    }
