"""Turn control over HTTP: cancel a turn, decide a tool call."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from signalbox.services.gateway import tool_decisions, turns
from signalbox.services.gateway.deps import CurrentUser, GatewayDep, IdPath
from signalbox.services.gateway.routes.interactions import REFUSALS
from signalbox.shared.gateway_api import ToolDecided, TurnCancel
from signalbox.shared.protocol import MAX_REASON_CHARS, NO_NUL

router = APIRouter(prefix="/api")


class ToolDecision(BaseModel):
    """Body of ``POST /api/tool-calls/{id}/decision``."""

    decision: Literal["allow", "deny"]
    reason: str | None = Field(default=None, max_length=MAX_REASON_CHARS, pattern=NO_NUL)


@router.post("/turns/{turn_id}/cancel", response_model=TurnCancel, responses=REFUSALS)
async def cancel_turn(turn_id: IdPath, user: CurrentUser, gateway: GatewayDep) -> TurnCancel:
    """Ask a queued or running turn to stop."""
    return TurnCancel.model_validate(await turns.cancel_turn(gateway, user.id, turn_id))


@router.post("/tool-calls/{call_id}/decision", response_model=ToolDecided, responses=REFUSALS)
async def decide_tool(
    call_id: IdPath, body: ToolDecision, user: CurrentUser, gateway: GatewayDep
) -> ToolDecided:
    """Allow or deny a call that waits for a decision (409 if it does not)."""
    result = await tool_decisions.decide_tool(gateway, user.id, call_id, body.decision, body.reason)
    return ToolDecided.model_validate(result)
