"""The running turn's transcript, kept in memory for the life of its runner (its lease).

A model step used to rebuild the conversation from SQL: every message, every call, the
latest compaction note and the attachments, five queries and their ORM loads per step,
growing with the conversation. But a stored message never changes, nor does a call once it
ended, and only this runner adds to the conversation while it holds the turn (earlier turns
have finished; a later one waits). So a runner reads them once, at its first step, and then
adds what it stores itself: its steps' messages and calls (``store.store_step``) and the
results it records (``store.record_results``). A call it has not seen end is read again
before each step (one query by id): a human's decision, an expiry or a client's answer
ends calls elsewhere. Compaction writes a new note: ``reset`` then reads everything again.

SQL stays the truth: a new runner (a resumed, continued or redelivered turn) starts from it,
and nothing here is ever written back. Proposal notes are not kept here
(``model_step.proposal_notes``: they change when a human decides).
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, and_, bindparam, select
from sqlalchemy.engine import Row

from signalbox.services.orchestrator import compaction
from signalbox.services.orchestrator.store import EndedCall
from signalbox.services.orchestrator.transcript import (
    FINAL_CALL_STATUSES,
    ProposalNotes,
    build_messages,
    load_attachments,
)
from signalbox.shared.db.models import Message, ToolCall, Turn


@dataclass(frozen=True)
class _Message:
    id: str
    role: str
    content: list[Any]
    seq: int


@dataclass
class _Call:
    id: str
    message_id: str
    position: int
    tool_use_id: str
    tool: str
    status: str
    output: str | None
    error: str | None
    timeout_s: float


def _call(row: ToolCall | Row[Any]) -> _Call:
    return _Call(
        row.id,
        row.message_id,
        row.position,
        row.tool_use_id,
        row.tool,
        row.status,
        row.output,
        row.error,
        row.timeout_s,
    )


class RunningTranscript:
    """The messages and calls of one runner's conversation (or child turn), read once."""

    def __init__(self, conversation_id: str, child_turn_id: str | None = None) -> None:
        self.conversation_id = conversation_id
        self.child_turn_id = child_turn_id  # a spawn_agent child sees its own turn alone
        self.loaded = False
        self.summary: str | None = None  # the latest compaction note's
        self.messages: list[_Message] = []
        self.calls: dict[str, list[_Call]] = defaultdict(list)  # by message id
        self.unended: dict[str, _Call] = {}  # calls not seen to end, by id
        self.attachments: dict[str, list[dict[str, Any]]] = {}

    def reset(self) -> None:
        """Read everything again at the next step (a compaction note was written)."""
        self.loaded = False

    def sent(self, conn: Connection, notes: ProposalNotes) -> list[dict[str, Any]]:
        """The Messages-API ``messages`` as the model should see them now (with the
        compaction note, if any): what ``compaction.load`` read from SQL each step."""
        if not self.loaded:
            self._load(conn)
        elif self.unended:
            self._refresh(conn)
        attachments = {k: copy.deepcopy(v) for k, v in self.attachments.items()}
        messages = build_messages(self.messages, self.calls, notes, attachments)
        return compaction.with_note(messages, self.summary)

    def stored(self, message: Message, calls: Sequence[ToolCall]) -> None:
        """A step this runner just committed (``store.store_step``)."""
        if not self.loaded:
            return  # read whole at the next step
        self.messages.append(_Message(message.id, message.role, message.content, message.seq))
        for row in calls:
            call = _call(row)
            self.calls[call.message_id].append(call)
            if call.status not in FINAL_CALL_STATUSES:
                self.unended[call.id] = call

    def ended(self, ended: Sequence[EndedCall]) -> None:
        """Calls this runner just ended (``store.record_results``: as stored)."""
        for done in ended:
            call = self.unended.pop(done.id, None)
            if call is not None:
                call.status, call.output, call.error = done.status, done.output, done.error

    def _load(self, conn: Connection) -> None:
        """Read the transcript: statements built once, their columns as tuples (no ORM
        object is loaded; they were a fifth of an in-process turn's SQL)."""
        self.summary = None
        if self.child_turn_id is not None:
            scope: dict[str, Any] = {"child_turn_id": self.child_turn_id}
            messages, calls = _CHILD_MESSAGES, _CHILD_CALLS
        else:
            note = compaction.latest_note(conn, self.conversation_id)
            after = 0
            if note is not None:
                after, self.summary = note
            scope = {"conversation_id": self.conversation_id, "after": after}
            messages, calls = _MESSAGES, _CALLS
        rows = conn.execute(messages, scope).all()
        call_rows = conn.execute(calls, scope).all()
        self.messages = [_Message(m.id, m.role, m.content, m.seq) for m in rows]
        self.calls = defaultdict(list)
        self.unended = {}
        for row in call_rows:
            call = _call(row)
            self.calls[call.message_id].append(call)
            if call.status not in FINAL_CALL_STATUSES:
                self.unended[call.id] = call
        self.attachments = load_attachments(conn, rows)
        self.loaded = True

    def _refresh(self, conn: Connection) -> None:
        """Read again the calls not seen to end (others end calls too)."""
        rows = conn.execute(_UNENDED, {"call_ids": list(self.unended)}).all()
        for call_id, status, output, error in rows:
            call = self.unended[call_id]
            call.status, call.output, call.error = status, output, error
            if status in FINAL_CALL_STATUSES:
                del self.unended[call_id]


# A child turn's own messages, or the conversation's after its latest compaction note (a
# spawn_agent child's messages left out: only the parent call's result is seen), and their
# calls but a plan's steps (they are in the plan's one result).
_CHILD_SCOPE = Message.turn_id == bindparam("child_turn_id")
_SCOPE = and_(
    Message.conversation_id == bindparam("conversation_id"),
    Message.turn_id.in_(
        select(Turn.id).where(
            Turn.conversation_id == bindparam("conversation_id"),
            Turn.parent_call_id.is_(None),
        )
    ),
    Message.seq > bindparam("after"),
)
_MESSAGE_COLUMNS = (
    Message.id,
    Message.role,
    Message.content,
    Message.seq,
    Message.turn_id,
    Message.step,
)
_CALL_COLUMNS = (
    ToolCall.id,
    ToolCall.message_id,
    ToolCall.position,
    ToolCall.tool_use_id,
    ToolCall.tool,
    ToolCall.status,
    ToolCall.output,
    ToolCall.error,
    ToolCall.timeout_s,
)


def _calls_in(scope: Any) -> Any:
    return (
        select(*_CALL_COLUMNS)
        .join(Message, Message.id == ToolCall.message_id)
        .where(scope, ToolCall.plan_call_id.is_(None))
    )


_MESSAGES = select(*_MESSAGE_COLUMNS).where(_SCOPE).order_by(Message.seq)
_CHILD_MESSAGES = select(*_MESSAGE_COLUMNS).where(_CHILD_SCOPE).order_by(Message.seq)
_CALLS = _calls_in(_SCOPE)
_CHILD_CALLS = _calls_in(_CHILD_SCOPE)
_UNENDED = select(ToolCall.id, ToolCall.status, ToolCall.output, ToolCall.error).where(
    ToolCall.id.in_(bindparam("call_ids", expanding=True))
)
