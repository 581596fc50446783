"""WebSocket frames of PROTOCOL.md as tagged pydantic models, parsed at the edge by one adapter.

Client frames form one discriminated union (``ClientFrame``) read by ``parse_client_frame``;
server frames are small models serialised with ``frame.model_dump_json()``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

ErrorCode = Literal[
    "bad_frame",
    "unknown_type",
    "not_found",
    "conflict",
    "rate_limited",
    "turn_busy",
    "replay_gap",
    "unavailable",
    "internal",
    "too_large",
    "unsupported_type",
    "budget_exceeded",  # added: the user's token budget for the period is used up
    "quota_exceeded",  # added: the user holds as many of a stored thing as allowed
    "forbidden",  # added: an admin-only route called by a user who is not an admin
]

CLIENT_FRAME_TYPES = (
    "subscribe",
    "unsubscribe",
    "user_turn",
    "cancel",
    "decide_tool",
    "decide_proposal",
    "answer",
    "tool_result",
    "ping",
)

# PostgreSQL cannot keep a NUL in a text column: text a client sends to be stored carries a
# field ``pattern=NO_NUL``, so a NUL is refused as input (HTTP 422), never a 500 at commit.
NO_NUL = r"^[^\x00]*$"


# The longest value each client field may carry, in characters: the same over the WebSocket
# and HTTP, listed in docs/protocol.md ("Longest values", held to this by
# tests/test_protocol_doc.py). A longer one is refused (`bad_frame`, HTTP 422) before
# anything is stored.
MAX_TURN_TEXT_CHARS = 100_000  # ~25k tokens; even at 6 bytes a character (JSON \u escapes) < 1 MiB
MAX_ANSWER_CHARS = MAX_TURN_TEXT_CHARS  # an answer to ask_user is a user message too
MAX_TOOL_OUTPUT_CHARS = MAX_TURN_TEXT_CHARS  # a client tool's result, as the user's own input
MAX_REASON_CHARS = 2_000  # why a human denied a call or rejected a proposal
MAX_ID_CHARS = 200  # any id a client names or chooses (the server's own are ~30)
MAX_CLIENT_TOOLS = 64  # tools one user_turn may declare
MAX_TOOL_DESCRIPTION_CHARS = 10_000
MAX_ATTACHMENTS = 20  # uploads one user_turn may attach (POST /api/uploads)

Id = Annotated[str, Field(max_length=MAX_ID_CHARS, pattern=NO_NUL)]


class _Frame(BaseModel):
    model_config = ConfigDict(extra="ignore")
    req: Id | None = None


class ClientToolSpec(BaseModel):
    """A tool the client runs itself, declared on ``user_turn``."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$", max_length=64)
    description: str = Field(default="", max_length=MAX_TOOL_DESCRIPTION_CHARS, pattern=NO_NUL)
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    timeout_s: float = Field(default=60.0, gt=0, le=3600)

    @field_validator("input_schema")
    @classmethod
    def _no_nul(cls, schema: dict[str, Any]) -> dict[str, Any]:
        # Stored as JSON with the turn: PostgreSQL refuses a NUL anywhere in it (a 500).
        if _holds_nul(schema):
            raise ValueError("input_schema may not contain a NUL character")
        return schema


def _holds_nul(value: Any) -> bool:
    """True if a NUL is in any string (key or value) of a JSON value; iterative, any depth."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return False


class Subscribe(_Frame):
    """Subscribe to a conversation, replaying every stored event after ``after``."""

    type: Literal["subscribe"]
    conversation_id: Id
    after: Id | None = None


class Unsubscribe(_Frame):
    """Stop receiving a conversation's events."""

    type: Literal["unsubscribe"]
    conversation_id: Id


class UserTurn(_Frame):
    """A user's message; ``conversation_id`` null starts a new conversation."""

    type: Literal["user_turn"]
    conversation_id: Id | None = None
    text: str = Field(min_length=1, max_length=MAX_TURN_TEXT_CHARS, pattern=NO_NUL)
    client_turn_id: Id | None = None
    workspace: Id | None = None  # a valid name is at most 100 (shared/workspace_paths.py)
    client_tools: list[ClientToolSpec] | None = Field(default=None, max_length=MAX_CLIENT_TOOLS)
    attachments: list[Id] | None = Field(default=None, max_length=MAX_ATTACHMENTS)
    # The agent a new conversation runs as (GET /api/agents); on a started conversation
    # only the agent it is bound to (added).
    agent: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,64}$", max_length=64)


class Cancel(_Frame):
    """Cancel a queued or running turn."""

    type: Literal["cancel"]
    turn_id: Id


class DecideTool(_Frame):
    """A human's decision on a tool call that needs one."""

    type: Literal["decide_tool"]
    call_id: Id
    decision: Literal["allow", "deny"]
    reason: str | None = Field(default=None, max_length=MAX_REASON_CHARS, pattern=NO_NUL)


class DecideProposal(_Frame):
    """Approve or reject a proposal."""

    type: Literal["decide_proposal"]
    proposal_id: Id
    decision: Literal["approve", "reject"]
    reason: str | None = Field(default=None, max_length=MAX_REASON_CHARS, pattern=NO_NUL)


class Answer(_Frame):
    """The human's answer to an ``ask_user`` question."""

    type: Literal["answer"]
    question_id: Id
    text: str = Field(max_length=MAX_ANSWER_CHARS, pattern=NO_NUL)


class ClientToolResult(_Frame):
    """The result of a client tool, authorised by the single-use token of its call."""

    type: Literal["tool_result"]
    call_id: Id
    token: Id
    output: str = Field(max_length=MAX_TOOL_OUTPUT_CHARS, pattern=NO_NUL)
    is_error: bool = False


class Ping(_Frame):
    """Liveness check; answered with ``pong``."""

    type: Literal["ping"]


ClientFrame = Annotated[
    Subscribe
    | Unsubscribe
    | UserTurn
    | Cancel
    | DecideTool
    | DecideProposal
    | Answer
    | ClientToolResult
    | Ping,
    Field(discriminator="type"),
]

_client_frame_adapter: TypeAdapter[ClientFrame] = TypeAdapter(ClientFrame)


class FrameError(ValueError):
    """A client frame that cannot be used; ``code`` is the protocol's error code."""

    def __init__(self, code: ErrorCode, message: str, req: str | None = None) -> None:
        super().__init__(message)
        self.code: ErrorCode = code
        self.message = message
        self.req = req


def parse_client_frame(raw: str | bytes) -> ClientFrame:
    """Parse one client frame, or raise ``FrameError`` with ``bad_frame``/``unknown_type``."""
    import json

    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise FrameError("bad_frame", f"frame is not JSON: {exc}") from None
    except RecursionError:  # nesting deeper than the interpreter's stack (found by fuzzing)
        raise FrameError("bad_frame", "frame is nested too deeply") from None
    if not isinstance(obj, dict):
        raise FrameError("bad_frame", f"expected a JSON object, got {type(obj).__name__}")
    req = obj.get("req")
    req = req if isinstance(req, str) and len(req) <= MAX_ID_CHARS else None  # echoed back
    kind = obj.get("type")
    if kind not in CLIENT_FRAME_TYPES:
        raise FrameError("unknown_type", f"unknown frame type {kind!r}", req)
    try:
        return _client_frame_adapter.validate_python(obj)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"][1:]) or "frame"
        raise FrameError("bad_frame", f"{kind}: {where}: {first['msg']}", req) from None


class Ack(BaseModel):
    """Reply to a frame that worked; extra fields depend on the frame."""

    model_config = ConfigDict(extra="allow")
    type: Literal["ack"] = "ack"
    req: str | None = None


class ErrorFrame(BaseModel):
    """Reply to a frame that did not work."""

    type: Literal["error"] = "error"
    req: str | None = None
    code: ErrorCode
    message: str


class Pong(BaseModel):
    """Reply to ``ping``."""

    type: Literal["pong"] = "pong"
    req: str | None = None


class Heartbeat(BaseModel):
    """Sent on an idle socket every ``heartbeat_s``."""

    type: Literal["heartbeat"] = "heartbeat"
    ts: str
