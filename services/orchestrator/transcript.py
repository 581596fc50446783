"""The model's view of a conversation, built from SQL: stored messages plus tool results.

Tool results are not stored as messages; each comes from its ``ToolCall`` row, right after
the assistant message that asked for it, in ``position`` order. So every ``tool_use`` the
model sees has exactly one ``tool_result`` whatever happened to the call (timeouts,
denials, cancels and crashes have synthetic results), and a call that has not finished
never reaches the model: its ``tool_use`` block is left out until it has a result.

A write tool's result only says what it proposed ("proposed, awaiting approval (proposal_id
…)"). Once a human decided that proposal, the same ``tool_result`` also says how it ended
("proposal … was applied by the human", or rejected, conflict, expired, withdrawn), read
from the ``proposals`` table (``load_proposal_notes``) on every step, so the model sees the outcome
on its next step whichever turn made the proposal.

A turn's attachments (uploads the gateway checked are the user's) are not stored in the
message either: the turn names them, and ``load_attachments`` puts their ``image`` and
``document`` blocks before the text of the turn's user message.
"""

from __future__ import annotations

import base64
import copy
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, get_args

from sqlalchemy import Connection, and_, bindparam, func, select
from sqlalchemy.orm import Session, aliased

from signalbox.shared.db.models import Message, Proposal, ToolCall, Turn, Upload
from signalbox.shared.events import ProposalStatus

FINAL_CALL_STATUSES = frozenset({"ok", "error", "timeout", "denied", "cancelled", "lost"})
# ``waiting``: on a human (ask_user) or on the client that runs the tool, the turn parked.
OPEN_CALL_STATUSES = frozenset({"pending", "needs_decision", "running", "waiting"})
# Every status but ``pending`` ends a proposal (one vocabulary: shared/events.py).
DECIDED_PROPOSAL_STATUSES = tuple(s for s in get_args(ProposalStatus) if s != "pending")


class MessageRow(Protocol):
    """What the builder reads of a stored message (``signalbox.shared.db.Message`` has it)."""

    @property
    def id(self) -> str: ...
    @property
    def role(self) -> str: ...
    @property
    def content(self) -> list[Any]: ...


class StoredMessageRow(MessageRow, Protocol):
    """A stored message with its place: the turn and step that wrote it."""

    @property
    def turn_id(self) -> str: ...
    @property
    def step(self) -> int: ...


class CallRow(Protocol):
    """What the builder reads of a tool call (``signalbox.shared.db.ToolCall`` has it)."""

    @property
    def id(self) -> str: ...
    @property
    def message_id(self) -> str: ...
    @property
    def position(self) -> int: ...
    @property
    def tool_use_id(self) -> str: ...
    @property
    def tool(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def output(self) -> str | None: ...
    @property
    def error(self) -> str | None: ...
    @property
    def timeout_s(self) -> float: ...


@dataclass(frozen=True)
class ProposalNote:
    """A decided proposal, told to the model with the result of the call that made it."""

    proposal_id: str
    status: str  # a DECIDED_PROPOSAL_STATUSES
    reason: str | None = None
    split_from: str | None = None  # set when a partial approval split it off a proposal


ProposalNotes = Mapping[str, Sequence[ProposalNote]]  # by the id of the call that proposed


def note_text(note: ProposalNote) -> str:
    """One line on how a proposal ended."""
    what = f"proposal {note.proposal_id}"
    if note.split_from:
        what += f" (the approved part of proposal {note.split_from})"
    why = f": {note.reason}" if note.reason else ""
    outcome = {
        "applied": "was applied by the human",
        "rejected": f"was rejected by the human{why}; nothing was written",
        "conflict": f"was approved but could not be applied (conflict{why}); nothing was written",
        "expired": "expired before anyone decided it; nothing was written",
        "cancelled": "was withdrawn because its turn was cancelled; nothing was written",
    }.get(note.status, f"ended {note.status!r}")
    return f"{what} {outcome}"


def result_text(call: CallRow, notes: Sequence[ProposalNote] = ()) -> str:
    """What the model is told about a finished call (and the proposals it made)."""
    text = _call_text(call)
    if notes:
        text += "\n" + "\n".join(note_text(n) for n in notes)
    return text


def _call_text(call: CallRow) -> str:
    output = call.output or ""
    if call.status == "ok":
        return output or "(no output)"
    reason = {
        "error": f"error: {call.error or 'the tool failed'}",
        "timeout": f"the tool timed out after {call.timeout_s:g} s"
        + (f": {call.error}" if call.error else ""),
        "denied": "the call was denied" + (f": {call.error}" if call.error else ""),
        "cancelled": "the call was cancelled before it finished",
        "lost": call.error
        or "the tool worker vanished without reporting a result; the call may or may not "
        "have taken effect",
    }.get(call.status, f"the call ended with status {call.status!r}")
    return f"{reason}\n{output}" if output and output not in reason else reason


def tool_result_block(call: CallRow, notes: Sequence[ProposalNote] = ()) -> dict[str, Any]:
    """The ``tool_result`` block of a finished call."""
    block: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": call.tool_use_id,
        "content": result_text(call, notes),
    }
    if call.status != "ok":
        block["is_error"] = True
    return block


def _push(out: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    # The API wants alternating roles; a turn that produced no answer (failed) or a step whose
    # calls are all unfinished would otherwise leave two messages of one role side by side.
    if not blocks:
        return
    if out and out[-1]["role"] == role:
        out[-1]["content"].extend(blocks)
    else:
        out.append({"role": role, "content": blocks})


def build_messages(
    messages: Iterable[MessageRow],
    calls: Mapping[str, Sequence[CallRow]],
    notes: ProposalNotes | None = None,
    attachments: Mapping[str, Sequence[dict[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    """The Messages-API ``messages`` of a conversation: ``messages`` in order, ``calls`` by
    message id, ``notes`` on decided proposals by the id of the call that proposed them,
    ``attachments``: the content blocks of a user message's attachments, by message id."""
    notes = notes or {}
    attachments = attachments or {}
    out: list[dict[str, Any]] = []
    for msg in messages:
        blocks = [dict(b) for b in msg.content if isinstance(b, dict)]
        if msg.role != "assistant":
            said = [b for b in blocks if b.get("type") != "text" or b.get("text")]
            # Attachments before the words, as the Messages API docs advise for images.
            _push(out, msg.role, [*attachments.get(msg.id, ()), *said])
            continue
        finished = {
            c.tool_use_id: c
            for c in sorted(calls.get(msg.id, ()), key=lambda c: c.position)
            if c.status in FINAL_CALL_STATUSES
        }
        kept: list[dict[str, Any]] = []
        answered: list[CallRow] = []
        for block in blocks:
            if block.get("type") == "tool_use":
                call = finished.pop(str(block.get("id")), None)
                if call is None:
                    continue  # unfinished (or unknown) call: not shown until it has a result
                kept.append(block)
                answered.append(call)
            elif block.get("type") != "text" or block.get("text"):
                kept.append(block)
        _push(out, "assistant", kept)
        results = [
            tool_result_block(c, notes.get(c.id, ()))
            for c in sorted(answered, key=lambda c: c.position)
        ]
        _push(out, "user", results)
    return out


_parent = aliased(Proposal)
# Built once (a statement built per step cost more than the query takes to run).
_DECIDED_PROPOSALS = (
    select(
        Proposal.id,
        Proposal.status,
        Proposal.reason,
        Proposal.parent_id,
        func.coalesce(Proposal.call_id, _parent.call_id),
    )
    .outerjoin(_parent, _parent.id == Proposal.parent_id)
    .where(
        Proposal.conversation_id == bindparam("conversation_id"),
        Proposal.status.in_(DECIDED_PROPOSAL_STATUSES),
    )
    .order_by(Proposal.decided_at, Proposal.id)
)


def load_proposal_notes(
    db: Session | Connection, conversation_id: str
) -> dict[str, list[ProposalNote]]:
    """The decided proposals of a conversation, by the id of the call that proposed them.

    A partial approval's child proposal has no call of its own: it is told with its
    parent's call.
    """
    rows = db.execute(_DECIDED_PROPOSALS, {"conversation_id": conversation_id}).all()
    notes: dict[str, list[ProposalNote]] = defaultdict(list)
    for proposal_id, status, reason, parent_id, call_id in rows:
        if call_id is not None:
            notes[call_id].append(ProposalNote(proposal_id, status, reason, parent_id))
    return dict(notes)


def load_messages(
    session: Session,
    conversation_id: str,
    child_turn_id: str | None = None,
    notes: ProposalNotes | None = None,
    after_seq: int = 0,
    through_seq: int | None = None,
) -> list[dict[str, Any]]:
    """The transcript of a conversation as the model should see it now.

    A spawn_agent child turn sees only its own messages (``child_turn_id``); the
    conversation sees none of its children's, only the parent call's result. ``notes``:
    the proposal notes already read (``load_proposal_notes``); None reads them here.
    ``after_seq``/``through_seq``: only the messages in that range (a compaction note
    stands for those up to its ``through_seq``: ``compaction.py``).
    """
    if child_turn_id is not None:
        scope = Message.turn_id == child_turn_id
    else:
        scope = and_(
            Message.conversation_id == conversation_id,
            Message.turn_id.in_(
                select(Turn.id).where(
                    Turn.conversation_id == conversation_id, Turn.parent_call_id.is_(None)
                )
            ),
        )
    if after_seq:
        scope = and_(scope, Message.seq > after_seq)
    if through_seq is not None:
        scope = and_(scope, Message.seq <= through_seq)
    rows = session.scalars(select(Message).where(scope).order_by(Message.seq)).all()
    call_rows = session.scalars(
        select(ToolCall)
        .join(Message, Message.id == ToolCall.message_id)
        .where(scope, ToolCall.plan_call_id.is_(None))  # a plan's steps: in its one result
    ).all()
    by_message: dict[str, list[ToolCall]] = defaultdict(list)
    for call in call_rows:
        by_message[call.message_id].append(call)
    if notes is None:
        notes = {} if child_turn_id is not None else load_proposal_notes(session, conversation_id)
    return build_messages(rows, by_message, notes, load_attachments(session, rows))


# -- attachments: a turn's uploads, sent with its user message as content blocks ----------

_BLOCK_CACHE_MAX = 32  # built blocks kept (uploads never change): a step re-reads no bytes
_block_cache: OrderedDict[str, dict[str, Any]] = OrderedDict()
_block_lock = threading.Lock()


def attachment_block(kind: str, media_type: str, name: str, data: bytes) -> dict[str, Any]:
    """The Messages-API block of one upload: ``image`` (base64), ``document`` (base64 PDF),
    or ``document`` with a text source (a text file), titled with the file's name."""
    if kind == "text":
        source = {"type": "text", "media_type": "text/plain", "data": data.decode("utf-8")}
        return {"type": "document", "source": source, "title": name}
    encoded = base64.standard_b64encode(data).decode("ascii")
    source = {"type": "base64", "media_type": media_type, "data": encoded}
    if kind == "image":
        return {"type": "image", "source": source}
    return {"type": "document", "source": source, "title": name}


def _blocks_of(db: Session | Connection, upload_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The block of each upload, built once per process (the bytes are read only then)."""
    with _block_lock:
        found = {i: _block_cache[i] for i in upload_ids if i in _block_cache}
    missing = [i for i in upload_ids if i not in found]
    if missing:
        rows = db.execute(_UPLOADS, {"upload_ids": missing}).all()
        with _block_lock:
            for upload_id, kind, media_type, name, data in rows:
                block = attachment_block(kind, media_type, name, data)
                found[upload_id] = _block_cache[upload_id] = block
                while len(_block_cache) > _BLOCK_CACHE_MAX:
                    _block_cache.popitem(last=False)
    return found


_UPLOADS = select(Upload.id, Upload.kind, Upload.media_type, Upload.name, Upload.data).where(
    Upload.id.in_(bindparam("upload_ids", expanding=True))
)
_ATTACHMENTS = select(Turn.id, Turn.attachments).where(
    Turn.id.in_(bindparam("turn_ids", expanding=True))
)


def load_attachments(
    db: Session | Connection, rows: Sequence[StoredMessageRow]
) -> dict[str, list[dict[str, Any]]]:
    """The attachment blocks of each turn's user message, by message id.

    A turn's own user message is the one with role ``user`` at step 0 (store.open_turn
    writes it); the turn's ``attachments`` name its uploads, checked by the gateway.
    """
    first: dict[str, str] = {}  # turn id -> its user message id
    for row in rows:
        if row.role == "user" and row.step == 0:
            first.setdefault(row.turn_id, row.id)
    if not first:
        return {}
    named = {
        turn_id: list(ids)
        for turn_id, ids in db.execute(_ATTACHMENTS, {"turn_ids": list(first)}).all()
        if ids
    }
    if not named:
        return {}
    blocks = _blocks_of(db, [i for ids in named.values() for i in ids])
    return {
        first[turn_id]: [copy.deepcopy(blocks[i]) for i in ids if i in blocks]
        for turn_id, ids in named.items()
    }
