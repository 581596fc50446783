"""What a parked turn waits for, over HTTP: the ``answer`` and ``tool_result`` frames' twins.

Each route calls the very function the WebSocket session calls (``interactions.py``), so the
checks (ownership, the single-use token, answered once, not expired) are the same ones.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from signalbox.services.gateway import interactions
from signalbox.services.gateway.deps import CurrentUser, GatewayDep, IdPath
from signalbox.shared.gateway_api import AnswerRecorded, GatewayErrorBody, ToolResultRecorded
from signalbox.shared.protocol import MAX_ANSWER_CHARS, MAX_ID_CHARS, MAX_TOOL_OUTPUT_CHARS, NO_NUL

router = APIRouter(prefix="/api")

# The refusals of the routes that act on a turn or call (bodies of ``GatewayError``).
REFUSALS: dict[int | str, dict[str, Any]] = {
    404: {"model": GatewayErrorBody, "description": "not found (another user's object too)"},
    409: {"model": GatewayErrorBody, "description": "it no longer waits for this"},
}


class AnswerBody(BaseModel):
    """Body of ``POST /api/questions/{id}/answer``: the ``answer`` frame's ``text``."""

    text: str = Field(max_length=MAX_ANSWER_CHARS, pattern=NO_NUL)


class ToolResultBody(BaseModel):
    """Body of ``POST /api/tool-calls/{id}/result``: the ``tool_result`` frame's fields."""

    token: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    output: str = Field(max_length=MAX_TOOL_OUTPUT_CHARS, pattern=NO_NUL)
    is_error: bool = False


@router.post("/questions/{question_id}/answer", response_model=AnswerRecorded, responses=REFUSALS)
async def answer_question(
    question_id: IdPath, body: AnswerBody, user: CurrentUser, gateway: GatewayDep
) -> AnswerRecorded:
    """Answer an ``ask_user`` question (409 if answered already or expired)."""
    result = await interactions.answer_question(gateway, user.id, question_id, body.text)
    return AnswerRecorded.model_validate(result)


@router.post("/tool-calls/{call_id}/result", response_model=ToolResultRecorded, responses=REFUSALS)
async def client_tool_result(
    call_id: IdPath, body: ToolResultBody, user: CurrentUser, gateway: GatewayDep
) -> ToolResultRecorded:
    """Return a client tool's result with its call's single-use token (404 if wrong or reused)."""
    result = await interactions.client_tool_result(
        gateway, user.id, call_id, body.token, body.output, body.is_error
    )
    return ToolResultRecorded.model_validate(result)
