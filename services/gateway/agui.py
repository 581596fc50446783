"""Signalbox events as AG-UI events: the mapping behind ``POST /api/agui``, kept pure.

AG-UI (the agent-UI event protocol of CopilotKit, assistant-ui and others) streams one
*run* as typed events. A run here is one Signalbox turn: ``thread_id`` is the conversation,
``run_id`` the client's id for the turn. ``map_event`` turns each event of the
conversation's stream into the AG-UI events it means, given what the run has seen so far
(``RunMapping``, immutable); it does no I/O, so the whole mapping is tested without a
gateway, and the route only feeds it the stream the SSE route already reads.

What has no AG-UI counterpart is not dropped: approvals, questions, proposals and the
rest travel as ``CUSTOM`` events named ``signalbox.<kind>`` carrying the event's data, and
the client answers them through the gateway's ordinary HTTP routes (docs/protocol.md,
"AG-UI"). The interrupt outcome of AG-UI 1.0 is not used: a Signalbox turn waiting for a
human stays one turn (it parks and goes on), so ending the run there would leave the rest
of the turn without a run to stream in.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from ag_ui.core import (
    BaseEvent,
    CustomEvent,
    RunAgentInput,
    RunErrorEvent,
    RunFinishedCancelledOutcome,
    RunFinishedEvent,
    RunFinishedSuccessOutcome,
    RunStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    TokenUsage,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    UserMessage,
)

from signalbox.services.gateway.errors import BadInput
from signalbox.shared.events import Event
from signalbox.shared.ids import is_id
from signalbox.shared.protocol import MAX_ID_CHARS, MAX_TURN_TEXT_CHARS

CUSTOM_PREFIX = "signalbox."  # CUSTOM events are named signalbox.<event kind>
# Kinds that belong to the conversation, not to the run: the route starts reading after
# the turn's turn_queued, so they only show up when a repeated run replays the stream.
NOT_RUN_EVENTS = frozenset({"conversation_created", "turn_queued"})
# Turn statuses that end the run with RUN_ERROR rather than RUN_FINISHED.
ERROR_STATUSES = frozenset({"failed", "step_limit", "timed_out", "budget_exceeded"})


@dataclass(frozen=True)
class TurnRequest:
    """What a ``RunAgentInput`` asks of Signalbox: a turn of one conversation."""

    conversation_id: str  # the input's threadId
    run_id: str  # becomes the turn's client_turn_id
    text: str  # the last user message's text


def turn_request(body: RunAgentInput) -> TurnRequest:
    """The turn ``body`` asks for; ``BadInput`` (422) naming the field it cannot use.

    Client ``tools`` are refused rather than dropped: AG-UI answers a frontend tool with a
    new run carrying a tool message, Signalbox with a ``tool_result`` inside the same turn,
    and silently offering the model fewer tools than the client declared would mislead it.
    ``resume`` is refused because no run here ends with an interrupt to resume. ``state``,
    ``context`` and ``forwardedProps`` are ignored: the conversation is the state.
    """
    if not is_id(body.thread_id):
        raise BadInput(f"threadId {body.thread_id[:60]!r} is not a conversation id")
    if not body.run_id or len(body.run_id) > MAX_ID_CHARS or "\x00" in body.run_id:
        raise BadInput(f"runId must be 1 to {MAX_ID_CHARS} characters without NUL")
    if body.tools:
        raise BadInput(
            "tools: client tools are not taken over AG-UI; declare them on a user_turn frame "
            "or POST /api/conversations/{id}/turns"
        )
    if body.resume:
        raise BadInput(
            "resume: runs here never end with an interrupt; answer approvals and "
            "questions through their HTTP routes"
        )
    if not body.messages or not isinstance(body.messages[-1], UserMessage):
        raise BadInput("messages: the last message must be the user's, the text of the turn")
    text = _text_of(body.messages[-1])
    if not text or len(text) > MAX_TURN_TEXT_CHARS or "\x00" in text:
        raise BadInput(
            f"messages: the last user message must have 1 to {MAX_TURN_TEXT_CHARS} "
            "characters of text without NUL"
        )
    return TurnRequest(body.thread_id, body.run_id, text)


def _text_of(message: UserMessage) -> str:
    if isinstance(message.content, str):
        return message.content
    texts = []
    for part in message.content:
        if part.type != "text":
            raise BadInput(f"messages: a {part.type!r} part cannot be sent; only text")
        texts.append(part.text)
    return "\n".join(texts)


@dataclass(frozen=True)
class RunMapping:
    """What one AG-UI run has seen so far; ``map_event`` returns the next one."""

    thread_id: str
    run_id: str
    turn_id: str
    open_message_id: str | None = None  # the assistant message being streamed, if any
    last_message_id: str | None = None  # the message tool calls hang under
    messages: int = 0  # assistant messages started: numbers the next message id
    model: str | None = None  # from turn_started, for the usage entry
    calls: frozenset[str] = frozenset()  # tool calls announced with TOOL_CALL_START
    finished: bool = False  # turn_finished was mapped: nothing follows


def run_started(run: RunMapping) -> RunStartedEvent:
    """The run's first event, sent before any of the turn's own."""
    return RunStartedEvent(thread_id=run.thread_id, run_id=run.run_id)


def map_event(run: RunMapping, event: Event) -> tuple[RunMapping, list[BaseEvent]]:
    """The AG-UI events ``event`` means in ``run``, and the run as it stands after it.

    Events of other turns (another client's turn, a sub-agent's child turn) and anything
    after ``turn_finished`` map to nothing.
    """
    if run.finished or event.turn_id != run.turn_id or event.kind in NOT_RUN_EVENTS:
        return run, []
    data = event.data
    kind = event.kind
    if kind == "text_delta":
        return _text(run, str(data.get("text", "")))
    if kind == "assistant_message":
        return _assistant_message(run, str(data.get("text", "")))
    if kind == "turn_resumed":
        # The resumed step streams its text again from the start: what the dead runner
        # streamed cannot be taken back from an AG-UI client, so its message is closed.
        run, closed = _close_message(run)
        return run, [*closed, _custom(event)]
    if kind == "turn_started":
        return replace(run, model=data.get("model")), [_custom(event)]
    if kind == "tool_call_started":
        return _tool_call(run, data)
    if kind == "tool_call_needs_decision":
        # The model asked for the call: it is shown as a call now, its approval beside it.
        run, announced = _tool_call(run, data)
        return run, [*announced, _custom(event)]
    if kind == "tool_call_finished":
        # A call refused before it ran (by policy, or denied) was never started.
        run, announced = _tool_call(run, data)
        return run, [*announced, _tool_result(data), _custom(event)]
    if kind == "turn_finished":
        run, closed = _close_message(run)
        return replace(run, finished=True), [*closed, _run_end(run, data)]
    return run, [_custom(event)]


def _custom(event: Event) -> CustomEvent:
    return CustomEvent(
        name=f"{CUSTOM_PREFIX}{event.kind}",
        value={"event_id": event.id, "turn_id": event.turn_id, "ts": event.ts, **event.data},
    )


def _open_message(run: RunMapping) -> tuple[RunMapping, list[BaseEvent]]:
    if run.open_message_id is not None:
        return run, []
    message_id = f"{run.turn_id}-m{run.messages + 1}"
    run = replace(
        run, open_message_id=message_id, last_message_id=message_id, messages=run.messages + 1
    )
    return run, [TextMessageStartEvent(message_id=message_id, role="assistant")]


def _close_message(run: RunMapping) -> tuple[RunMapping, list[BaseEvent]]:
    if run.open_message_id is None:
        return run, []
    return replace(run, open_message_id=None), [TextMessageEndEvent(message_id=run.open_message_id)]


def _text(run: RunMapping, text: str) -> tuple[RunMapping, list[BaseEvent]]:
    if not text:
        return run, []  # AG-UI refuses an empty delta
    run, opened = _open_message(run)
    assert run.open_message_id is not None
    return run, [*opened, TextMessageContentEvent(message_id=run.open_message_id, delta=text)]


def _assistant_message(run: RunMapping, text: str) -> tuple[RunMapping, list[BaseEvent]]:
    """The end of one model step's text; the whole text when no delta came before it."""
    events: list[BaseEvent] = []
    if run.open_message_id is None:
        run, events = _text(run, text)
    run, closed = _close_message(run)
    return run, [*events, *closed]


def _tool_call(run: RunMapping, data: dict[str, Any]) -> tuple[RunMapping, list[BaseEvent]]:
    """START, ARGS, END the first time a call is seen; nothing after (a call allowed after
    a decision is started again, and every call ends with ``tool_call_finished``)."""
    call_id = str(data["call_id"])
    if call_id in run.calls:
        return run, []
    run = replace(run, calls=run.calls | {call_id})
    start = ToolCallStartEvent(
        tool_call_id=call_id,
        tool_call_name=str(data["tool"]),
        parent_message_id=run.last_message_id,
    )
    if "input" not in data:  # tool_call_finished does not repeat the input
        return run, [start, ToolCallEndEvent(tool_call_id=call_id)]
    # Signalbox announces a call with its whole input at once, so ARGS comes in one piece.
    args = ToolCallArgsEvent(tool_call_id=call_id, delta=json.dumps(data["input"]))
    return run, [start, args, ToolCallEndEvent(tool_call_id=call_id)]


def _tool_result(data: dict[str, Any]) -> ToolCallResultEvent:
    """The call's output; a call that did not end ``ok`` says how it ended, and why."""
    call_id = str(data["call_id"])
    status = str(data.get("status", "ok"))
    output = str(data.get("output") or "")
    content = output
    if status != "ok":
        reason = data.get("error") or output
        content = f"[{status}] {reason}" if reason else f"[{status}]"
    return ToolCallResultEvent(
        message_id=f"{call_id}-result", tool_call_id=call_id, content=content, role="tool"
    )


def _usage(run: RunMapping, usage: dict[str, Any]) -> list[TokenUsage]:
    """Signalbox's usage in AG-UI's accounting, where cache reads and writes are parts of
    ``input_tokens`` (the Messages API reports them beside it)."""
    cache_read = int(usage.get("cache_read_input_tokens", 0))
    cache_write = int(usage.get("cache_creation_input_tokens", 0))
    input_tokens = int(usage.get("input_tokens", 0)) + cache_read + cache_write
    output_tokens = int(usage.get("output_tokens", 0))
    return [
        TokenUsage(
            model=run.model,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            total_tokens=input_tokens + output_tokens,
            cached_input_tokens=cache_read,
            cache_write_input_tokens=cache_write,
        )
    ]


def _run_end(run: RunMapping, data: dict[str, Any]) -> BaseEvent:
    status = str(data.get("status", "completed"))
    usage = _usage(run, data.get("usage") or {})
    if status in ERROR_STATUSES:
        message = str(data.get("error") or f"the turn ended {status}")
        return RunErrorEvent(message=message, code=status, usage=usage)
    outcome = RunFinishedCancelledOutcome() if status == "cancelled" else None
    return RunFinishedEvent(
        thread_id=run.thread_id,
        run_id=run.run_id,
        result={"turn_id": run.turn_id, "status": status, "steps": data.get("steps")},
        outcome=outcome or RunFinishedSuccessOutcome(),
        usage=usage,
    )
