"""Event kinds of PROTOCOL.md: the envelope every client receives and the data of each kind."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from signalbox.shared.timestamps import rfc3339

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
    "thinking_delta",  # added: extended thinking, as it streams
    "context_compacted",  # added: older turns folded into a compaction note
    "tools_selected",  # added: the agent's planner chose the tools of this turn
    "plan_started",  # added: a run_plan call's steps, before any runs
    "plan_step",  # added: one plan step moved (running, then how it ended)
    "plan_finished",  # added: every step of a run_plan call ended
    "budget_warning",  # added: the user's token budget passed its soft threshold
]

ToolCallStatus = Literal["ok", "error", "timeout", "denied", "cancelled", "lost"]
# "timed_out" (added): the turn's wall-clock limit passed.
# "budget_exceeded" (added): the user's token budget ran out; the turn's last step finished.
TurnStatus = Literal[
    "completed", "cancelled", "failed", "step_limit", "timed_out", "budget_exceeded"
]
# "cancelled": withdrawn because the turn that proposed it was cancelled (added).
ProposalStatus = Literal["pending", "applied", "rejected", "conflict", "expired", "cancelled"]
FileOperation = Literal["create", "update", "delete"]

OUTPUT_PREVIEW_BYTES = 4096  # PROTOCOL.md: tool_call_finished carries at most 4 KiB of output


def utc_now() -> str:
    """The current time as RFC 3339 UTC with a ``Z``."""
    return rfc3339(datetime.now(UTC))


class _Data(BaseModel):
    model_config = ConfigDict(extra="allow")


class ConversationCreated(_Data):
    workspace: str
    title: str
    # The bound agent version (added), absent for the deployment's default agent.
    agent: str | None = None
    agent_version: int | None = None


AttachmentKind = Literal["text", "image", "pdf"]


class Attachment(_Data):
    """An upload attached to a user's message: enough for a client to draw its chip."""

    upload_id: str
    name: str
    kind: AttachmentKind
    size: int


class TurnQueued(_Data):
    text: str
    client_turn_id: str | None = None
    # Left out when there are none: a turn without attachments is announced as before.
    attachments: list[Attachment] = Field(default_factory=list, exclude_if=lambda v: not v)


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


class ThinkingDelta(_Data):
    text: str


class ToolsSelected(_Data):
    tools: list[str]  # the tools offered for the rest of the turn, by name
    offered: int  # how many the agent had to choose from
    fallback: bool  # the planner gave no usable answer: every tool is offered


class BudgetWarningData(_Data):
    period: Literal["day", "month"]
    limit_tokens: int
    used_tokens: int
    threshold: float  # the fraction of the budget that, once used, warns (once per period)
    resets_at: str  # RFC 3339: when the period's budget starts again


class ContextCompacted(_Data):
    turns_folded: int  # the older turns the compaction note replaces in what is sent
    tokens_before: int
    tokens_after: int


PlanStepStatus = Literal["planned", "running", "ok", "error", "timeout", "skipped", "cancelled"]


class PlannedStep(BaseModel):
    """A step as ``plan_started`` lists it."""

    save_as: str
    tool: str
    depends_on: list[str]  # the steps whose outputs its input refers to
    level: int  # 0: depends on none; else one more than its deepest dependency


class PlanStarted(_Data):
    call_id: str  # the run_plan call
    steps: list[PlannedStep]


class PlanStepChanged(_Data):
    call_id: str  # the run_plan call
    save_as: str
    status: PlanStepStatus
    step_call_id: str | None = None  # the step's own tool call, once it has one
    error: str | None = None


class PlanFinished(_Data):
    call_id: str
    steps: dict[str, int]  # how many steps ended in each status


# -- builders: each payload that more than one place emits is put together here, once ------


class StartedCall(Protocol):
    """What ``tool_call_started`` tells of a call (a ``ToolCall`` row has it all)."""

    @property
    def id(self) -> str: ...
    @property
    def tool(self) -> str: ...
    @property
    def input(self) -> dict[str, Any]: ...
    @property
    def timeout_s(self) -> float: ...


def tool_call_started(
    call: StartedCall, executor: Literal["server", "client"] = "server", token: str | None = None
) -> ToolCallStarted:
    """``tool_call_started`` of ``call``; a client tool's carries its single-use ``token``."""
    return ToolCallStarted(
        call_id=call.id,
        tool=call.tool,
        input=call.input,
        timeout_s=call.timeout_s,
        executor=executor,
        token=token,
    )


def output_preview(output: str, limit_bytes: int = OUTPUT_PREVIEW_BYTES) -> str:
    """``output`` cut to at most ``limit_bytes`` of UTF-8, never inside a character."""
    raw = output.encode()
    if len(raw) <= limit_bytes:
        return output
    marker = "\n…(truncated)"
    cut = raw[: limit_bytes - len(marker.encode())]
    return cut.decode(errors="ignore") + marker


def tool_call_finished(
    call_id: str,
    tool: str,
    status: str,
    output: str | None,
    error: str | None,
    duration_ms: int | None,
    waited_ms: int = 0,
) -> ToolCallFinished:
    """``tool_call_finished``: the output cut to its preview; ``status`` must be a final one."""
    return ToolCallFinished.model_validate(
        {
            "call_id": call_id,
            "tool": tool,
            "status": status,
            "output": output_preview(output or ""),
            "error": error,
            "duration_ms": duration_ms or 0,
            "waited_ms": waited_ms,
        }
    )


def turn_finished(
    status: str, steps: int, usage: Mapping[str, Any], error: str | None = None
) -> TurnFinished:
    """``turn_finished``; ``status`` must be a final turn status."""
    return TurnFinished.model_validate(
        {"status": status, "steps": steps, "usage": dict(usage), "error": error}
    )


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
    "thinking_delta": ThinkingDelta,
    "context_compacted": ContextCompacted,
    "tools_selected": ToolsSelected,
    "plan_started": PlanStarted,
    "plan_step": PlanStepChanged,
    "plan_finished": PlanFinished,
    "budget_warning": BudgetWarningData,
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
