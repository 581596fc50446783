"""Event kinds of PROTOCOL.md: the envelope every client receives and the data of each kind."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

EventKind = Literal[
    "conversation_created",
    "turn_queued",
    "turn_started",
    "turn_resumed",
    "text_delta",
    "assistant_message",
    "tool_call_started",
    "tool_call_needs_decision",
    "tool_call_decided",
    "tool_call_finished",
    "proposal_created",
    "proposal_resolved",
    "question",
    "question_answered",
    "turn_finished",
]

ToolCallStatus = Literal["ok", "error", "timeout", "denied", "cancelled", "lost"]
TurnStatus = Literal["completed", "cancelled", "failed", "step_limit"]
# "cancelled": withdrawn because the turn that proposed it was cancelled (added).
ProposalStatus = Literal["pending", "applied", "rejected", "conflict", "expired", "cancelled"]
FileOperation = Literal["create", "update", "delete"]

OUTPUT_PREVIEW_BYTES = 4096  # PROTOCOL.md: tool_call_finished carries at most 4 KiB of output


def utc_now() -> str:
    """The current time as RFC 3339 UTC with a ``Z``."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _Data(BaseModel):
    model_config = ConfigDict(extra="allow")


class ConversationCreated(_Data):
    workspace: str
    title: str


class TurnQueued(_Data):
    text: str
    client_turn_id: str | None = None


class TurnStarted(_Data):
    model: str


class TurnResumed(_Data):
    step: int


class TextDelta(_Data):
    text: str


class AssistantMessage(_Data):
    text: str


class ToolCallStarted(_Data):
    call_id: str
    tool: str
    input: dict[str, Any]
    timeout_s: float
    executor: Literal["server", "client"] = "server"
    token: str | None = None


class ToolCallNeedsDecision(_Data):
    call_id: str
    tool: str
    input: dict[str, Any]
    expires_at: str


class ToolCallDecided(_Data):
    call_id: str
    decision: Literal["allow", "deny", "expired"]


class ToolCallFinished(_Data):
    call_id: str
    tool: str
    status: ToolCallStatus
    output: str
    error: str | None = None
    duration_ms: int  # how long it ran (0: it never ran)
    waited_ms: int = 0  # how long it waited for a human's decision before that


class ProposalFileRef(BaseModel):
    path: str
    operation: FileOperation


class ProposalCreated(_Data):
    proposal_id: str
    summary: str
    files: list[ProposalFileRef]
    parent_id: str | None = None  # set on the part a partial approval split off
    reverts: list[str] | None = None  # added: set on a revert, the proposals it undoes


class ProposalResolved(_Data):
    proposal_id: str
    status: ProposalStatus


class Question(_Data):
    question_id: str
    text: str
    options: list[str] | None = None


class QuestionAnswered(_Data):
    question_id: str


class Usage(BaseModel):
    input_tokens: int = 0  # neither read from nor written to the prompt cache
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0  # added: written to the prompt cache
    cache_read_input_tokens: int = 0  # added: read from the prompt cache
    cost_usd: float | None = None  # added: null when a model of the turn has no price


class TurnFinished(_Data):
    status: TurnStatus
    steps: int
    usage: Usage
    error: str | None = None


EVENT_DATA: dict[str, type[_Data]] = {
    "conversation_created": ConversationCreated,
    "turn_queued": TurnQueued,
    "turn_started": TurnStarted,
    "turn_resumed": TurnResumed,
    "text_delta": TextDelta,
    "assistant_message": AssistantMessage,
    "tool_call_started": ToolCallStarted,
    "tool_call_needs_decision": ToolCallNeedsDecision,
    "tool_call_decided": ToolCallDecided,
    "tool_call_finished": ToolCallFinished,
    "proposal_created": ProposalCreated,
    "proposal_resolved": ProposalResolved,
    "question": Question,
    "question_answered": QuestionAnswered,
    "turn_finished": TurnFinished,
}


class Event(BaseModel):
    """One event of a conversation's stream, as every client receives it."""

    type: Literal["event"] = "event"
    conversation_id: str
    id: str
    turn_id: str | None
    ts: str
    kind: EventKind
    data: dict[str, Any]
