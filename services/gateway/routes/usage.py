"""``GET /api/usage`` and ``GET /api/conversations/{id}/usage``: what the model cost me.

Sums of the ``model_requests`` rows the orchestrator records (``shared/db/usage.py``), only
ever the caller's own: in tokens as the API billed them, and in US dollars.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel
from sqlalchemy.orm import Session

from signalbox.services.gateway.deps import CurrentUser, GatewayDep, IdPath
from signalbox.services.gateway.ownership import owned_conversation
from signalbox.shared.db.usage import UsageSum, summarize

router = APIRouter()

UserGroupBy = Literal["conversation", "turn", "model", "purpose"]
ConversationGroupBy = Literal["turn", "model", "purpose"]


class UsageOut(BaseModel):
    """Usage of a set of model requests (``key``: the group's value, null for the total)."""

    key: str | None = None
    requests: int
    input_tokens: int  # neither read from nor written to the prompt cache
    output_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    cost_usd: float
    unpriced_requests: int  # their model had no price: not in cost_usd


class UsageReport(BaseModel):
    """The caller's usage: the total, and one entry per group when ``group_by`` is set."""

    user_id: str
    conversation_id: str | None = None
    group_by: str | None = None
    total: UsageOut
    groups: list[UsageOut]


def _report(
    session: Session,
    user_id: str,
    conversation_id: str | None,
    group_by: UserGroupBy | None,
    since: datetime | None,
) -> UsageReport:
    def out(row: UsageSum) -> UsageOut:
        return UsageOut(**asdict(row))

    [total] = summarize(session, user_id=user_id, conversation_id=conversation_id, since=since)
    groups = (
        summarize(
            session,
            user_id=user_id,
            conversation_id=conversation_id,
            since=since,
            group_by=group_by,
        )
        if group_by is not None
        else []
    )
    return UsageReport(
        user_id=user_id,
        conversation_id=conversation_id,
        group_by=group_by,
        total=out(total),
        groups=[out(g) for g in groups],
    )


@router.get("/api/usage", response_model=UsageReport)
async def my_usage(
    user: CurrentUser,
    gateway: GatewayDep,
    group_by: UserGroupBy | None = None,
    since: datetime | None = None,
) -> UsageReport:
    """All my model requests (since ``since``), optionally grouped."""
    return await gateway.db(lambda s: _report(s, user.id, None, group_by, since))


@router.get("/api/conversations/{conversation_id}/usage", response_model=UsageReport)
async def conversation_usage(
    conversation_id: IdPath,
    user: CurrentUser,
    gateway: GatewayDep,
    group_by: ConversationGroupBy | None = None,
    since: datetime | None = None,
) -> UsageReport:
    """My conversation's model requests; another user's conversation is 404."""

    def read(session: Session) -> UsageReport:
        owned_conversation(session, user.id, conversation_id)
        return _report(session, user.id, conversation_id, group_by, since)

    return await gateway.db(read)
