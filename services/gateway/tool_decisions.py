"""A human's allow/deny on a tool call that waits for one; the parked turn resumes anywhere.

A decision never fails open: one that arrives after the call's ``expires_at`` is refused
(``conflict``), because by then the orchestrator treats the call as denied.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal, cast

from sqlalchemy import CursorResult, or_, update
from sqlalchemy.orm import Session

from signalbox.services.gateway.errors import Conflict
from signalbox.services.gateway.ownership import owned_tool_call
from signalbox.services.gateway.state import Gateway
from signalbox.shared.db import ToolCall
from signalbox.shared.db.models import as_utc
from signalbox.shared.statuses import CallDecision, CallState
from signalbox.shared.timestamps import rfc3339


def _rfc3339(value: datetime) -> str:
    return rfc3339(value)


def _expired(call: ToolCall, now: datetime) -> bool:
    """True when the call's time for a decision is over (or the orchestrator expired it)."""
    if call.decision == CallDecision.EXPIRED:
        return True
    undecided = call.status == CallState.NEEDS_DECISION and call.decision is None
    return undecided and call.expires_at is not None and as_utc(call.expires_at) <= now


def _expired_conflict(call_id: str, call: ToolCall) -> Conflict:
    when = f" at {_rfc3339(call.expires_at)}" if call.expires_at is not None else ""
    return Conflict(
        f"tool call {call_id!r} expired{when}: it is denied and can no longer be decided"
    )


def record_decision(
    session: Session, user_id: str, call_id: str, decision: Literal["allow", "deny"]
) -> tuple[str, str]:
    """Set the call's decision once; (turn id, conversation id). ``Conflict`` if it cannot."""
    call, turn = owned_tool_call(session, user_id, call_id)
    now = datetime.now(UTC)
    if _expired(call, now):
        raise _expired_conflict(call_id, call)
    # Conditional: of two racing decisions (two tabs, two gateways, or a decision and the
    # orchestrator's expiry) exactly one wins; the expiry is checked again in SQL so a
    # decision that loses the race with the clock is refused, never recorded.
    result = cast(
        CursorResult[Any],
        session.execute(
            update(ToolCall)
            .where(
                ToolCall.id == call.id,
                ToolCall.status == CallState.NEEDS_DECISION,
                ToolCall.decision.is_(None),
                or_(ToolCall.expires_at.is_(None), ToolCall.expires_at > now),
            )
            .values(decision=decision)
            .execution_options(synchronize_session=False)
        ),
    )
    if result.rowcount != 1:
        session.refresh(call)
        if _expired(call, datetime.now(UTC)):
            raise _expired_conflict(call_id, call)
        raise Conflict(
            f"tool call {call_id!r} is not waiting for a decision "
            f"(status {call.status!r}, decision {call.decision!r})"
        )
    return turn.id, turn.conversation_id


async def decide_tool(
    gateway: Gateway,
    user_id: str,
    call_id: str,
    decision: Literal["allow", "deny"],
    reason: str | None = None,
) -> dict[str, Any]:
    """Record ``decision`` once, announce it, and re-enqueue the turn."""
    turn_id, conversation_id = await gateway.db(
        lambda s: record_decision(s, user_id, call_id, decision)
    )
    data: dict[str, Any] = {"call_id": call_id, "decision": decision}
    if reason:
        data["reason"] = reason
    await gateway.events.append(conversation_id, "tool_call_decided", data, turn_id)
    await gateway.enqueue_turn(turn_id)
    return {"call_id": call_id, "turn_id": turn_id, "decision": decision}
