"""What a human or a client sends back to a parked turn: an ``answer`` to an ``ask_user``
question, or the ``tool_result`` of a client tool. Each is recorded once on its ``ToolCall``
(a conditional update), announced, and the turn is enqueued to resume on any orchestrator.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import CursorResult, update
from sqlalchemy.orm import Session

from signalbox.services.gateway.errors import Conflict, NotFound
from signalbox.services.gateway.ownership import owned_tool_call
from signalbox.services.gateway.state import Gateway
from signalbox.shared.auth import hash_token, same_secret
from signalbox.shared.db import ToolCall
from signalbox.shared.events import tool_call_finished
from signalbox.shared.statuses import CallState, Executor

ASK_USER = "ask_user"  # the orchestrator's built-in question tool
INLINE, CLIENT = Executor.INLINE, Executor.CLIENT  # ask_user, and a client tool


def _expired(call: ToolCall, now: datetime) -> bool:
    if call.expires_at is None:
        return False
    expires = call.expires_at if call.expires_at.tzinfo else call.expires_at.replace(tzinfo=UTC)
    return expires <= now


def _duration_ms(call: ToolCall, now: datetime) -> int:
    if call.started_at is None:
        return 0
    started = call.started_at if call.started_at.tzinfo else call.started_at.replace(tzinfo=UTC)
    return max(0, int((now - started).total_seconds() * 1000))


def _finish_waiting(
    session: Session, call: ToolCall, status: str, output: str, error: str | None
) -> bool:
    """waiting → ``status``, once; False if someone else (or an expiry) ended it first."""
    now = datetime.now(UTC)
    if _expired(call, now):
        return False
    result = cast(
        CursorResult[Any],
        session.execute(
            update(ToolCall)
            .where(ToolCall.id == call.id, ToolCall.status == CallState.WAITING)
            .values(
                status=status,
                output=output,
                error=error,
                token_hash=None,  # single use
                finished_at=now,
                duration_ms=_duration_ms(call, now),
            )
            .execution_options(synchronize_session=False)
        ),
    )
    return result.rowcount == 1


async def answer_question(
    gateway: Gateway, user_id: str, question_id: str, text: str
) -> dict[str, Any]:
    """Record the answer to an ``ask_user`` question (its id is the call id) and resume."""

    def record(session: Session) -> tuple[str, str]:
        call, turn = owned_tool_call(session, user_id, question_id)
        if call.tool != ASK_USER or call.executor != INLINE:
            raise NotFound(f"question {question_id!r} not found")
        if not _finish_waiting(session, call, CallState.OK, text, None):
            raise Conflict(f"question {question_id!r} is not waiting for an answer")
        return turn.id, turn.conversation_id

    turn_id, conversation_id = await gateway.db(record)
    await gateway.events.append(
        conversation_id, "question_answered", {"question_id": question_id}, turn_id
    )
    await gateway.enqueue_turn(turn_id)
    return {"question_id": question_id, "turn_id": turn_id}


async def client_tool_result(
    gateway: Gateway,
    user_id: str,
    call_id: str,
    token: str,
    output: str,
    is_error: bool,
) -> dict[str, Any]:
    """Record a client tool's result if ``token`` is the call's live single-use token."""

    def record(session: Session) -> tuple[str, str, str, int]:
        call, turn = owned_tool_call(session, user_id, call_id)
        valid = (
            call.executor == CLIENT
            and call.status == CallState.WAITING
            and call.token_hash is not None
            and same_secret(hash_token(token), call.token_hash)
        )
        # A wrong, reused or late token reads the same as an unknown call: nothing to probe.
        failed = (CallState.ERROR, "the client reported an error")
        status, error = failed if is_error else (CallState.OK, None)
        if not valid or not _finish_waiting(session, call, status, output, error):
            raise NotFound(f"no client tool call {call_id!r} waits for this token")
        now = datetime.now(UTC)
        return turn.id, turn.conversation_id, call.tool, _duration_ms(call, now)

    turn_id, conversation_id, tool, duration_ms = await gateway.db(record)
    finished = tool_call_finished(
        call_id,
        tool,
        CallState.ERROR if is_error else CallState.OK,
        output,
        "the client reported an error" if is_error else None,
        duration_ms,
        waited_ms=0,  # a client tool needs no decision
    )
    await gateway.events.append(
        conversation_id, "tool_call_finished", finished.model_dump(mode="json"), turn_id
    )
    await gateway.enqueue_turn(turn_id)
    return {"call_id": call_id, "turn_id": turn_id}
