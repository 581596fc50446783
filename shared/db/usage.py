"""Model usage and cost summed from ``model_requests``: per user, conversation, turn, model or
purpose. The gateway's ``GET /api/usage`` and ``signalbox usage`` both read it here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import Connection, bindparam, func, select
from sqlalchemy.orm import Session

from signalbox.shared.db.models import ModelRequest

GroupBy = Literal["user", "conversation", "turn", "model", "purpose"]
GROUP_COLUMNS: dict[str, Any] = {
    "user": ModelRequest.user_id,
    "conversation": ModelRequest.conversation_id,
    "turn": ModelRequest.root_turn_id,  # a sub-agent's requests count for the turn that paid
    "model": ModelRequest.model,
    "purpose": ModelRequest.purpose,
}


@dataclass(frozen=True)
class UsageSum:
    """Usage of a set of model requests; ``key`` names the group (None: all of them)."""

    key: str | None
    requests: int
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    cost_usd: float
    unpriced_requests: int  # requests whose model had no price: not in cost_usd


# The sums of a ``UsageSum``, in its field order after ``key`` (bar ``unpriced_requests``,
# from the count of priced requests, last): one list for every reader of usage.
_SUMS = (
    func.count(ModelRequest.id),
    func.coalesce(func.sum(ModelRequest.input_tokens), 0),
    func.coalesce(func.sum(ModelRequest.output_tokens), 0),
    func.coalesce(func.sum(ModelRequest.cache_creation_input_tokens), 0),
    func.coalesce(func.sum(ModelRequest.cache_read_input_tokens), 0),
    func.coalesce(func.sum(ModelRequest.cost_usd), 0.0),
    func.count(ModelRequest.cost_usd),
)


def _usage_sum(key: str | None, sums: Sequence[Any]) -> UsageSum:
    count, inputs, outputs, written, read, cost, priced = sums
    return UsageSum(
        key,
        int(count),
        int(inputs),
        int(outputs),
        int(written),
        int(read),
        round(float(cost or 0.0), 6),
        int(count) - int(priced),
    )


# A turn's sums, asked as it finishes: built once, the turn bound (``select`` of the seven
# sums built anew and keyed for the statement cache cost more than running it).
_TURN_SUMS = select(*_SUMS).where(ModelRequest.turn_id == bindparam("turn_id"))
_ROOT_TURN_SUMS = select(*_SUMS).where(ModelRequest.root_turn_id == bindparam("turn_id"))


def turn_total(db: Session | Connection, turn_id: str, *, with_sub_agents: bool) -> UsageSum:
    """The sum over one turn's own requests, or (``with_sub_agents``) over those it paid
    for: its own and its sub-agents' (``root_turn_id``)."""
    statement = _ROOT_TURN_SUMS if with_sub_agents else _TURN_SUMS
    return _usage_sum(None, db.execute(statement, {"turn_id": turn_id}).one())


def summarize(
    session: Session,
    *,
    user_id: str | None = None,
    conversation_id: str | None = None,
    since: datetime | None = None,
    group_by: GroupBy | None = None,
) -> list[UsageSum]:
    """The sum over the requests selected, one per group (largest cost first), or one total."""
    key = GROUP_COLUMNS[group_by] if group_by is not None else None
    query = select(*([key] if key is not None else []), *_SUMS)
    if user_id is not None:
        query = query.where(ModelRequest.user_id == user_id)
    if conversation_id is not None:
        query = query.where(ModelRequest.conversation_id == conversation_id)
    if since is not None:
        query = query.where(ModelRequest.created_at >= since)
    if key is None:
        return [_usage_sum(None, session.execute(query).one())]
    sums = [_usage_sum(str(row[0]), row[1:]) for row in session.execute(query.group_by(key))]
    sums.sort(key=lambda s: (-s.cost_usd, s.key or ""))
    return sums
