"""Context compaction: older turns summarised into a note that replaces them in what is sent.

Before a step's request would exceed the model's context window (``context_window.py``),
the conversation's oldest finished turns are folded: a model call (usage purpose
``compaction``) summarises them, with the previous note if there was one, into a new
``compactions`` row, and from then on the request carries the note in place of every
message up to its ``through_seq``. Whole turns are folded, so every ``tool_use`` sent keeps
its ``tool_result`` and the thinking blocks of the turns kept stay where they were; the
turn being run is never folded. The stored transcript keeps everything; the note is stored
so later steps reuse it instead of summarising again. ``context_compacted`` says how many
turns were folded and the request's tokens before and after.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, bindparam, func, select
from sqlalchemy.orm import Session

from signalbox.services.orchestrator import metrics, usage
from signalbox.services.orchestrator.context_budget import CHARS_PER_TOKEN
from signalbox.services.orchestrator.model import (
    ModelError,
    ModelRequest,
    StepEnd,
    StepRetry,
    TextDelta,
)
from signalbox.services.orchestrator.transcript import ProposalNotes, load_messages
from signalbox.shared.db.models import Compaction, Message, Turn
from signalbox.shared.db.session import reading
from signalbox.shared.ids import new_id

if TYPE_CHECKING:
    from signalbox.services.orchestrator.turn_runner import TurnRunner

NOTE_HEADER = "[Summary of the earlier conversation, which is no longer shown in full]"
SUMMARY_SYSTEM = (
    "You summarise conversations between a user and an AI agent so the agent can carry on "
    "without the full transcript."
)
SUMMARY_INSTRUCTION = (
    "Write a compaction summary of the conversation above: the user's goals and requests, "
    "what was done and found (files, tool results, decisions), and anything still open. "
    "Be concise; keep names, numbers and paths exact."
)
SUMMARY_MAX_TOKENS = 2048
KEEP_FRACTION = 0.5  # after compacting, the turns kept fill at most this much of what the
# budget leaves besides the system prompt and tools: room for a good many steps before the next
RENDER_BLOCK_MAX_CHARS = 2000  # of one block, in what the summariser reads


@dataclass(frozen=True)
class _Span:
    turn_id: str
    first_seq: int
    last_seq: int


def latest_note(db: Session | Connection, conversation_id: str) -> tuple[int, str] | None:
    """The conversation's newest compaction note (it covers the most) as ``(through_seq,
    summary)``, or None: one statement built once."""
    row = db.execute(_LATEST_NOTE, {"conversation_id": conversation_id}).first()
    return (row[0], row[1]) if row is not None else None


_LATEST_NOTE = (
    select(Compaction.through_seq, Compaction.summary)
    .where(Compaction.conversation_id == bindparam("conversation_id"))
    .order_by(Compaction.through_seq.desc())
    .limit(1)
)


def with_note(messages: list[dict[str, Any]], summary: str | None) -> list[dict[str, Any]]:
    """``messages`` with the note in front of the first (a user message: a turn's first)."""
    if summary is None or not messages:
        return messages
    note = {"type": "text", "text": f"{NOTE_HEADER}\n{summary}"}
    first = messages[0]
    content = first["content"]
    blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
    return [{**first, "content": [note, *blocks]}, *messages[1:]]


def load(
    session: Session, runner: TurnRunner, notes: ProposalNotes
) -> tuple[list[dict[str, Any]], tuple[int, str] | None]:
    """The conversation's messages as sent: after its latest note, with the note; and the
    note's ``(through_seq, summary)``."""
    conversation_id = runner.info.conversation_id
    note = latest_note(session, conversation_id)
    after, summary = note if note is not None else (0, None)
    messages = load_messages(session, conversation_id, notes=notes, after_seq=after)
    return with_note(messages, summary), note


def _spans(session: Session, runner: TurnRunner, after_seq: int) -> list[_Span]:
    """The conversation's earlier turns with messages after ``after_seq``, oldest first."""
    rows = session.execute(
        select(Message.turn_id, func.min(Message.seq), func.max(Message.seq))
        .join(Turn, Turn.id == Message.turn_id)
        .where(
            Message.conversation_id == runner.info.conversation_id,
            Message.seq > after_seq,
            Turn.parent_call_id.is_(None),
            Turn.id != runner.info.turn_id,
        )
        .group_by(Message.turn_id)
        .order_by(func.min(Message.seq))
    ).all()
    current = session.scalar(
        select(func.min(Message.seq)).where(Message.turn_id == runner.info.turn_id)
    )
    # Only turns wholly before the one running: a turn after it (queued) has no messages.
    return [
        _Span(turn_id, first, last)
        for turn_id, first, last in rows
        if current is None or last < current
    ]


def compact(
    runner: TurnRunner,
    notes: ProposalNotes,
    size: Callable[[list[dict[str, Any]]], int],
    budget: int,
    harder: bool = False,
) -> list[dict[str, Any]] | None:
    """Fold the oldest turns so the request fits ``budget`` (``harder``: every earlier turn);
    the messages to send then, or None when there is no earlier turn to fold.

    The reads run outside a transaction (``reading``): ``size`` may ask the API to count
    tokens between them, and a PostgreSQL session idle in a transaction that long is ended
    by the server (``shared.db.session.IDLE_IN_TRANSACTION_S``)."""
    with reading(runner.rt.sessions) as s:
        before, previous = load(s, runner, notes)
        after, previous_summary = previous if previous is not None else (0, None)
        spans = _spans(s, runner, after)
        if not spans:
            return None
        tokens_before = size(before)
        folded = _choose(s, runner, notes, spans, size, budget, tokens_before, harder)
        through = folded[-1].last_seq
        old = load_messages(
            s, runner.info.conversation_id, notes=notes, after_seq=after, through_seq=through
        )
    summary = _summarise(runner, previous_summary, old, budget)
    with reading(runner.rt.sessions) as s:
        kept = load_messages(s, runner.info.conversation_id, notes=notes, after_seq=through)
    messages = with_note(kept, summary)
    tokens_after = size(messages)
    with runner.rt.sessions() as s, s.begin():
        s.add(
            Compaction(
                id=new_id("cmp"),
                conversation_id=runner.info.conversation_id,
                turn_id=runner.info.turn_id,
                through_seq=through,
                turns_folded=len(folded),
                summary=summary,
                tokens_before=tokens_before,
                tokens_after=tokens_after,
            )
        )
    runner.emit(
        "context_compacted",
        {
            "turns_folded": len(folded),
            "tokens_before": tokens_before,
            "tokens_after": tokens_after,
        },
    )
    return messages


def _choose(
    s: Session,
    runner: TurnRunner,
    notes: ProposalNotes,
    spans: list[_Span],
    size: Callable[[list[dict[str, Any]]], int],
    budget: int,
    total: int,
    harder: bool,
) -> list[_Span]:
    """The oldest turns whose folding leaves the rest within ``KEEP_FRACTION`` of the budget
    (at least one; every one when ``harder``)."""
    if harder:
        return spans
    fixed = size([])  # system and tools: there whatever is folded
    target = fixed + int((budget - fixed) * KEEP_FRACTION)
    conversation_id = runner.info.conversation_id
    chosen: list[_Span] = []
    for span in spans:
        chosen.append(span)
        turn = load_messages(
            s,
            conversation_id,
            notes=notes,
            after_seq=span.first_seq - 1,
            through_seq=span.last_seq,
        )
        total -= size(turn)
        if total <= target:
            break
    return chosen


def _render(messages: list[dict[str, Any]]) -> str:
    """The folded messages as plain text for the summariser (thinking left out)."""
    lines: list[str] = []
    for message in messages:
        who = "User" if message["role"] == "user" else "Assistant"
        content = message["content"]
        for block in content if isinstance(content, list) else [{"type": "text", "text": content}]:
            kind = block.get("type")
            if kind == "text":
                line = f"{who}: {block.get('text', '')}"
            elif kind == "tool_use":
                line = f"{who} called {block.get('name')} {json.dumps(block.get('input'))}"
            elif kind == "tool_result":
                line = f"Tool result: {block.get('content')}"
            elif kind in ("image", "document"):
                line = f"{who} attached a {kind}"
            else:
                continue  # thinking: the reasoning, not the record
            lines.append(line[:RENDER_BLOCK_MAX_CHARS])
    return "\n".join(lines)


def _summarise(
    runner: TurnRunner, previous: str | None, old: list[dict[str, Any]], budget: int
) -> str:
    """One model call: the previous note and the folded turns in, the new note out."""
    text = _render(old)
    if previous is not None:
        text = f"{NOTE_HEADER}\n{previous}\n\n{text}"
    keep = max(1000, budget * CHARS_PER_TOKEN // 2)  # the summariser's own window
    if len(text) > keep:
        text = f"[... {len(text) - keep} earlier characters left out ...]\n{text[-keep:]}"
    request = ModelRequest(
        system=SUMMARY_SYSTEM,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": text},
                    {
                        "type": "text",
                        "text": SUMMARY_INSTRUCTION,
                    },
                ],
            }
        ],
        max_tokens=SUMMARY_MAX_TOKENS,
        model=runner.agent.model,
    )
    parts: list[str] = []
    end: StepEnd | None = None
    for event in metrics.model_stream(runner.rt.model, request, "compaction"):
        if isinstance(event, TextDelta):
            parts.append(event.text)
        elif isinstance(event, StepRetry):
            parts.clear()
            row = usage.retried_row(runner, request.model, event)
            row.purpose = "compaction"
            usage.record(runner, row)
        elif isinstance(event, StepEnd):
            end = event
    if end is None:
        raise ModelError("the compaction call ended without finishing")
    model = end.model or request.model or runner.rt.model.name
    usage.record(runner, usage.request_row(runner, model, end, "compaction"))
    summary = "".join(parts).strip()
    if not summary:
        raise ModelError("the compaction call answered no summary")
    return summary
