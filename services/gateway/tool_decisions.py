"""A human's allow/deny on a tool call that waits for one; the parked turn resumes anywhere."""

from __future__ import annotations

from typing import Any, Literal, cast

from sqlalchemy import CursorResult, update
from sqlalchemy.orm import Session

from services.gateway.errors import Conflict
from services.gateway.ownership import owned_tool_call
from services.gateway.state import Gateway
from shared.db import ToolCall


async def decide_tool(
    gateway: Gateway,
    user_id: str,
    call_id: str,
    decision: Literal["allow", "deny"],
    reason: str | None = None,
) -> dict[str, Any]:
    """Record ``decision`` once, announce it, and re-enqueue the turn."""

    def record(session: Session) -> tuple[str, str]:
        call, turn = owned_tool_call(session, user_id, call_id)
        # Conditional: of two racing decisions (two tabs, two gateways) exactly one wins.
        result = cast(
            CursorResult[Any],
            session.execute(
                update(ToolCall)
                .where(
                    ToolCall.id == call.id,
                    ToolCall.status == "needs_decision",
                    ToolCall.decision.is_(None),
                )
                .values(decision=decision)
            ),
        )
        if result.rowcount != 1:
            raise Conflict(
                f"tool call {call_id!r} is not waiting for a decision "
                f"(status {call.status!r}, decision {call.decision!r})"
            )
        return turn.id, turn.conversation_id

    turn_id, conversation_id = await gateway.db(record)
    data: dict[str, Any] = {"call_id": call_id, "decision": decision}
    if reason:
        data["reason"] = reason
    await gateway.events.append(conversation_id, "tool_call_decided", data, turn_id)
    await gateway.enqueue_turn(turn_id)
    return {"call_id": call_id, "turn_id": turn_id, "decision": decision}
