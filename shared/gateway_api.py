"""Response bodies of the gateway's HTTP routes that act on a turn: what the gateway answers
(its ``response_model``) and what ``signalbox.client`` reads, defined once.

Each is the HTTP twin of a WebSocket frame's ``ack`` (docs/protocol.md, "Each action over
HTTP"); extra fields are kept, so a field added to a reply never breaks an older client.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from signalbox.shared.proposals_api import GitState
from signalbox.shared.protocol import ErrorCode


class _Reply(BaseModel):
    model_config = ConfigDict(extra="allow")


class GatewayErrorBody(BaseModel):
    """A refusal of the gateway: why, in words, and the protocol's error code."""

    detail: str
    code: ErrorCode


class TurnAccepted(_Reply):
    """``POST /api/conversations/{id}/turns``: the turn is stored and queued (202)."""

    turn_id: str
    conversation_id: str
    created: bool  # False for a repeated client_turn_id: the earlier turn's id


class TurnCancel(_Reply):
    """``POST /api/turns/{id}/cancel``: the turn's status when the cancel was asked."""

    turn_id: str
    conversation_id: str
    status: str


class ToolDecided(_Reply):
    """``POST /api/tool-calls/{id}/decision``: the decision is recorded; the turn resumes."""

    call_id: str
    turn_id: str
    decision: str


class AnswerRecorded(_Reply):
    """``POST /api/questions/{id}/answer``: the answer is recorded; the turn resumes."""

    question_id: str
    turn_id: str


class ToolResultRecorded(_Reply):
    """``POST /api/tool-calls/{id}/result``: the client tool's result is recorded."""

    call_id: str
    turn_id: str


class WsTicket(_Reply):
    """``POST /api/ws-tickets``: a single-use ticket for ``/ws`` or ``/stream``."""

    ticket: str
    expires_in_s: int


class ConversationSummary(_Reply):
    """A conversation in ``GET /api/conversations`` and ``POST /api/conversations`` (201)."""

    conversation_id: str
    workspace: str
    title: str
    created_at: str | None
    # The agent version the conversation is bound to; null: the deployment's default agent.
    agent: str | None = None
    agent_version: int | None = None


class Workspace(_Reply):
    """One of a user's workspaces; ``git`` is unknown (null) when ``git_checked`` is false."""

    name: str
    selected: bool
    path_exists: bool
    git: GitState | None
    git_checked: bool


class Workspaces(_Reply):
    """``GET /api/workspaces``: sorted by name, and the one new conversations use."""

    workspaces: list[Workspace]
    selected: str


class SelectedWorkspace(_Reply):
    """``POST /api/workspace/select``: the workspace new conversations now use."""

    name: str


class UploadPublic(_Reply):
    """``POST /api/uploads`` (201) and ``GET /api/uploads/{id}``: an upload's metadata.

    ``kind`` and ``media_type`` are what the bytes were sniffed as, never what the client
    said; ``upload_id`` goes in ``attachments`` of a ``user_turn``.
    """

    upload_id: str
    name: str
    kind: str  # a signalbox.shared.events.AttachmentKind: text | image | pdf
    media_type: str
    size: int
    sha256: str
    created_at: str | None


class TurnView(_Reply):
    """A turn in the detail of a conversation; ``sub_agents`` are its spawn_agent children."""

    turn_id: str
    seq: int
    status: str  # a signalbox.shared.statuses.TurnState
    text: str
    client_turn_id: str | None
    cancel_requested: bool
    error: str | None
    created_at: str | None
    finished_at: str | None
    parent_call_id: str | None
    sub_agents: list[TurnView]


class MessageView(_Reply):
    """One message of the transcript; ``parent_call_id`` is set on a sub-agent's."""

    message_id: str
    turn_id: str | None
    parent_call_id: str | None
    seq: int
    role: str
    content: Any
    created_at: str | None


class PendingDecision(_Reply):
    """A call that waits for ``decide_tool``."""

    call_id: str
    turn_id: str
    tool: str
    input: dict[str, Any]
    expires_at: str | None


class PendingQuestion(_Reply):
    """An ``ask_user`` call that waits for ``answer`` (its id is the call's)."""

    question_id: str
    turn_id: str
    text: str
    options: list[Any] | None
    expires_at: str | None


class PendingClientTool(_Reply):
    """A client tool not answered yet (its token is only in ``tool_call_started``)."""

    call_id: str
    turn_id: str
    tool: str
    input: dict[str, Any]
    timeout_s: float
    expires_at: str | None


class ProposalBrief(_Reply):
    """A proposal of the conversation, in brief (``GET /api/proposals/{id}`` has the rest)."""

    proposal_id: str
    status: str
    summary: str


class ConversationDetail(ConversationSummary):
    """``GET /api/conversations/{id}``: turns, transcript, what waits, and proposals."""

    turns: list[TurnView]
    messages: list[MessageView]
    pending_decisions: list[PendingDecision]
    pending_questions: list[PendingQuestion]
    pending_client_tools: list[PendingClientTool]
    proposals: list[ProposalBrief]


class AgentView(_Reply):
    """An agent in ``GET/POST/PUT /api/agents``: its newest version's configuration.

    ``config`` holds only the fields its version sets; the others are the deployment's
    defaults. ``scope`` ``deployment``: defined by an operator, read-only over the API.
    """

    name: str
    version: int
    scope: Literal["user", "deployment"]
    config: dict[str, Any]
    created_at: str | None
    version_created_at: str | None
