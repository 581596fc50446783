"""SQLAlchemy 2 models of everything durable: users, conversations, turns, the transcript,
tool calls, proposals, and the outbox of decisions still to publish."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def now() -> datetime:
    """The current UTC time, as stored."""
    return datetime.now(UTC)


def as_utc(moment: datetime) -> datetime:
    """``moment`` as an aware UTC datetime (SQLite hands back naive ones)."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


class Base(DeclarativeBase):
    """Declarative base of every Signalbox table."""

    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON, datetime: DateTime(timezone=True)}


class User(Base):
    __tablename__ = "users"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    selected_workspace: Mapped[str] = mapped_column(String(100), default="default")
    created_at: Mapped[datetime] = mapped_column(default=now)
    # The admin role: may see every user's usage, set limits and budgets, revoke tokens
    # (services/gateway/admin.py checks it, once).
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class ApiToken(Base):
    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=now)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)


class Workspace(Base):
    __tablename__ = "workspaces"
    __table_args__ = (UniqueConstraint("user_id", "name"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    created_at: Mapped[datetime] = mapped_column(default=now)


class Conversation(Base):
    __tablename__ = "conversations"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    workspace: Mapped[str] = mapped_column(String(100))
    title: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[datetime] = mapped_column(default=now)
    # Archived (DELETE /api/conversations/{id}): out of the lists, no new turns; its
    # events and proposals are kept for audit.
    archived_at: Mapped[datetime | None] = mapped_column(default=None)
    # The agent version the conversation runs as, bound when it starts (shared/agents.py);
    # null: the deployment's default agent. Name and number are copied for display: a
    # binding never changes, so the copy never goes stale.
    agent_version_id: Mapped[str | None] = mapped_column(
        ForeignKey("agent_versions.id"), default=None
    )
    agent_name: Mapped[str | None] = mapped_column(String(64), default=None)
    agent_version: Mapped[int | None] = mapped_column(Integer, default=None)

    turns: Mapped[list[Turn]] = relationship(back_populates="conversation", order_by="Turn.seq")


class Agent(Base):
    """A named agent: a user's own (``user_id``) or deployment-wide (``user_id`` null).

    Its configuration lives in immutable ``AgentVersion`` rows; archiving hides the name
    from lists and new conversations, never from a conversation already bound to it.
    """

    __tablename__ = "agents"
    __table_args__ = (UniqueConstraint("user_id", "name"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    user_id: Mapped[str | None] = mapped_column(ForeignKey("users.id"), default=None, index=True)
    name: Mapped[str] = mapped_column(String(64), index=True)
    created_at: Mapped[datetime] = mapped_column(default=now)
    archived_at: Mapped[datetime | None] = mapped_column(default=None)


class AgentVersion(Base):
    """One version of an agent: its ``AgentSpec`` as JSON, never changed once written."""

    __tablename__ = "agent_versions"
    __table_args__ = (UniqueConstraint("agent_id", "version"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    agent_id: Mapped[str] = mapped_column(ForeignKey("agents.id"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    spec: Mapped[dict[str, Any]] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(default=now)


class Turn(Base):
    """One user message and everything the agent did for it.

    ``status``: queued → running ⇄ parked → completed | cancelled | failed | step_limit.
    """

    __tablename__ = "turns"
    __table_args__ = (
        UniqueConstraint("conversation_id", "client_turn_id"),
        Index("ix_turns_waiting", "deployment", "status", "admitted_at"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    conversation_id: Mapped[str] = mapped_column(ForeignKey("conversations.id"), index=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    seq: Mapped[int] = mapped_column(Integer, default=0)
    text: Mapped[str] = mapped_column(Text)
    client_turn_id: Mapped[str | None] = mapped_column(String(200), default=None)
    client_tools: Mapped[list[Any] | None] = mapped_column(default=None)
    # The ids of the uploads attached to the user's message (``Upload``), in order.
    attachments: Mapped[list[Any] | None] = mapped_column(default=None)
    parent_call_id: Mapped[str | None] = mapped_column(String(40), default=None)
    status: Mapped[str] = mapped_column(String(20), default="queued", index=True)
    step: Mapped[int] = mapped_column(Integer, default=0)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    model: Mapped[str | None] = mapped_column(String(100), default=None)
    input_tokens: Mapped[int] = mapped_column(Integer, default=0)
    output_tokens: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    created_at: Mapped[datetime] = mapped_column(default=now)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    # When admission (shared/admission.py) gave the queued turn a slot; null while it waits
    # for its user's fair share. Only an admitted turn starts.
    admitted_at: Mapped[datetime | None] = mapped_column(default=None)
    # The deployment (its Redis prefix) whose queues run the turn: deployments that share a
    # database admit only their own turns. Set by the gateway that stores the turn, or by
    # the first delivery of a turn stored without one (a scheduler tick).
    deployment: Mapped[str | None] = mapped_column(String(100), default=None)
    # started_at + the agent's turn_timeout_s, set when the turn starts: past it the turn
    # ends timed_out. In SQL so a parked turn is woken by it like by a decision's expiry.
    deadline_at: Mapped[datetime | None] = mapped_column(default=None)
    # The tools the agent's planner chose for this turn (services/orchestrator/planner.py);
    # null: no planner ran, every tool of the agent is offered. Kept so a resumed turn offers
    # the same ones without asking again.
    tools_selected: Mapped[list[Any] | None] = mapped_column(default=None)

    conversation: Mapped[Conversation] = relationship(back_populates="turns")


class Upload(Base):
    """A file a user uploaded to attach to a turn: its bytes and what they were sniffed as.

    Written in one INSERT once the whole body passed its checks, never changed after: a
    turn that names it reads the same bytes on every step.
    """

    __tablename__ = "uploads"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    name: Mapped[str] = mapped_column(String(255))
    kind: Mapped[str] = mapped_column(String(10))  # text | image | pdf
    media_type: Mapped[str] = mapped_column(String(100))
    size: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64))
    data: Mapped[bytes] = mapped_column(LargeBinary, deferred=True)
    created_at: Mapped[datetime] = mapped_column(default=now)


class Message(Base):
    """One message of the transcript, in Anthropic content-block form.

    Tool results are not stored here: they are built from ``ToolCall`` rows, so every
    ``tool_use`` always has exactly one ``tool_result``.
    """

    __tablename__ = "messages"
    __table_args__ = (UniqueConstraint("conversation_id", "seq"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    conversation_id: Mapped[str] = mapped_column(ForeignKey("conversations.id"), index=True)
    turn_id: Mapped[str] = mapped_column(ForeignKey("turns.id"), index=True)
    seq: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Integer, default=0)
    role: Mapped[str] = mapped_column(String(20))
    content: Mapped[list[Any]] = mapped_column()
    input_tokens: Mapped[int] = mapped_column(Integer, default=0)
    output_tokens: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(default=now)


class ToolCall(Base):
    """One ``tool_use`` of the model and its single result.

    ``status``: pending | needs_decision | running, then exactly one of
    ok | error | timeout | denied | cancelled | lost.
    """

    __tablename__ = "tool_calls"
    __table_args__ = (UniqueConstraint("message_id", "position"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    turn_id: Mapped[str] = mapped_column(ForeignKey("turns.id"), index=True)
    message_id: Mapped[str] = mapped_column(ForeignKey("messages.id"), index=True)
    position: Mapped[int] = mapped_column(Integer)
    tool_use_id: Mapped[str] = mapped_column(String(100))
    tool: Mapped[str] = mapped_column(String(200))
    input: Mapped[dict[str, Any]] = mapped_column()
    executor: Mapped[str] = mapped_column(String(10), default="server")
    status: Mapped[str] = mapped_column(String(20), default="pending", index=True)
    timeout_s: Mapped[float] = mapped_column(default=30.0)
    output: Mapped[str | None] = mapped_column(Text, default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    decision: Mapped[str | None] = mapped_column(String(20), default=None)
    expires_at: Mapped[datetime | None] = mapped_column(default=None)
    token_hash: Mapped[str | None] = mapped_column(String(64), default=None)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    duration_ms: Mapped[int | None] = mapped_column(Integer, default=None)
    # Set on the call of a ``run_plan`` step (shared/db/plans.py): the plan's own call. The
    # transcript leaves such calls out; the plan's one result stands for them.
    plan_call_id: Mapped[str | None] = mapped_column(String(40), default=None, index=True)


class Proposal(Base):
    """A set of file changes an agent proposed; a human approves or rejects it."""

    __tablename__ = "proposals"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    conversation_id: Mapped[str] = mapped_column(ForeignKey("conversations.id"), index=True)
    turn_id: Mapped[str | None] = mapped_column(String(40), default=None)
    call_id: Mapped[str | None] = mapped_column(String(40), default=None)
    workspace: Mapped[str] = mapped_column(String(100))
    summary: Mapped[str] = mapped_column(Text, default="")
    status: Mapped[str] = mapped_column(String(20), default="pending", index=True)
    version: Mapped[int] = mapped_column(Integer, default=1)
    created_at: Mapped[datetime] = mapped_column(default=now)
    decided_at: Mapped[datetime | None] = mapped_column(default=None)
    decided_by: Mapped[str | None] = mapped_column(String(40), default=None)
    reason: Mapped[str | None] = mapped_column(Text, default=None)
    # Set on the proposal a partial approval split off: it holds the files that were approved.
    parent_id: Mapped[str | None] = mapped_column(String(40), default=None, index=True)
    # Set on a revert proposal: the applied proposals whose changes it undoes.
    reverts: Mapped[list[str] | None] = mapped_column(JSON, default=None)

    files: Mapped[list[ProposalFile]] = relationship(
        back_populates="proposal", order_by="ProposalFile.position", cascade="all, delete-orphan"
    )


class ProposalFile(Base):
    __tablename__ = "proposal_files"
    __table_args__ = (UniqueConstraint("proposal_id", "position"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    proposal_id: Mapped[str] = mapped_column(ForeignKey("proposals.id"), index=True)
    position: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    operation: Mapped[str] = mapped_column(String(10))
    before: Mapped[str | None] = mapped_column(Text, default=None)
    after: Mapped[str | None] = mapped_column(Text, default=None)
    before_sha256: Mapped[str | None] = mapped_column(String(64), default=None)

    proposal: Mapped[Proposal] = relationship(back_populates="files")


class Outbox(Base):
    """A message committed with the state change it announces, published by a relay."""

    __tablename__ = "outbox"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    topic: Mapped[str] = mapped_column(String(50))
    payload: Mapped[dict[str, Any]] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(default=now)
    sent_at: Mapped[datetime | None] = mapped_column(default=None, index=True)


class ModelRequest(Base):
    """One request to the model, as the API billed it (docs/operations.md, "Model cost").

    ``input_tokens`` is what was neither read from nor written to the prompt cache (the
    API's meaning); the prompt is the sum of the three input fields. ``root_turn_id``: the
    turn that pays (a sub-agent's requests are charged to the turn that spawned it).
    ``cost_usd`` is priced when recorded; null when the model has no price.
    """

    __tablename__ = "model_requests"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user_id: Mapped[str] = mapped_column(String(40), index=True)
    conversation_id: Mapped[str] = mapped_column(String(40), index=True)
    turn_id: Mapped[str] = mapped_column(String(40), index=True)
    root_turn_id: Mapped[str] = mapped_column(String(40), index=True)
    purpose: Mapped[str] = mapped_column(String(20))  # step | sub_agent | planner | compaction
    # ok: answered; retried: its stream broke and the step started again; cancelled: cut by
    # a cancel or the turn's time limit (its tokens then estimated: the API never said).
    outcome: Mapped[str] = mapped_column(String(20), default="ok")
    model: Mapped[str] = mapped_column(String(100))
    input_tokens: Mapped[int] = mapped_column(Integer, default=0)
    output_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cache_creation_input_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cache_read_input_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cost_usd: Mapped[float | None] = mapped_column(Float, default=None)
    created_at: Mapped[datetime] = mapped_column(default=now, index=True)


class Compaction(Base):
    """A compaction note: a model's summary of a conversation's older messages, which
    replaces them in what the model is sent (the messages themselves stay).

    Kept so each step reuses it rather than summarising again; a conversation's newest
    note covers the most (``through_seq``: the last message it folds).
    """

    __tablename__ = "compactions"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    conversation_id: Mapped[str] = mapped_column(ForeignKey("conversations.id"), index=True)
    turn_id: Mapped[str] = mapped_column(String(40))  # the turn whose step made it
    through_seq: Mapped[int] = mapped_column(Integer)
    turns_folded: Mapped[int] = mapped_column(Integer)
    summary: Mapped[str] = mapped_column(Text)
    tokens_before: Mapped[int] = mapped_column(Integer)
    tokens_after: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=now)
