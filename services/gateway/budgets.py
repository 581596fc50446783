"""Token budgets at the gateway: refuse a turn that would start over one, and show them.

The figures are ``shared/db/budgets.py``'s (the usage the orchestrator records), read at
``Gateway.clock``'s now. A turn refused here stores nothing; one already running when the
budget runs out is ended by the orchestrator (``services/orchestrator/budget.py``).
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel
from sqlalchemy.orm import Session

from signalbox.services.gateway.errors import BudgetExceeded, NotFound
from signalbox.services.gateway.metrics import user_class
from signalbox.services.gateway.state import Gateway
from signalbox.shared.db import User, UserLimits
from signalbox.shared.db.budgets import BudgetState, Period, budget_states, exceeded_budget
from signalbox.shared.db.concurrency import insert_or_get
from signalbox.shared.timestamps import rfc3339


class BudgetOut(BaseModel):
    """One budget of a user and what its current period used."""

    period: Period
    limit_tokens: int
    used_tokens: int
    remaining_tokens: int
    exceeded: bool
    period_start: str  # RFC 3339, UTC
    resets_at: str  # RFC 3339, UTC


class BudgetReport(BaseModel):
    """A user's budgets (empty: none set, the user is not limited)."""

    user_id: str
    budgets: list[BudgetOut]


def budget_out(state: BudgetState) -> BudgetOut:
    """The API's view of one budget."""
    return BudgetOut(
        period=state.period,
        limit_tokens=state.limit_tokens,
        used_tokens=state.used_tokens,
        remaining_tokens=max(0, state.limit_tokens - state.used_tokens),
        exceeded=state.exceeded,
        period_start=rfc3339(state.period_start),
        resets_at=rfc3339(state.resets_at),
    )


async def budget_report(gateway: Gateway, user_id: str) -> BudgetReport:
    """``user_id``'s budgets now."""
    now = gateway.clock()

    def read(session: Session) -> BudgetReport:
        states = budget_states(session, user_id, now)
        return BudgetReport(user_id=user_id, budgets=[budget_out(s) for s in states])

    return await gateway.db(read)


def check_budget(gateway: Gateway, session: Session, user_id: str, now: datetime) -> bool:
    """``BudgetExceeded`` if a budget of ``user_id`` is used up at ``now``, else whether the
    user is an admin (for per-class metrics). Runs in the caller's transaction and thread."""
    user = session.get(User, user_id)
    is_admin = bool(user and user.is_admin)
    over = exceeded_budget(session, user_id, now)
    if over is None:
        return is_admin
    gateway.metrics.budget_refusals.labels(user_class(is_admin), over.period).inc()
    raise BudgetExceeded(over.describe())


async def refuse_over_budget(gateway: Gateway, user_id: str) -> None:
    """``BudgetExceeded`` if a budget of ``user_id`` is used up (nothing is stored)."""
    now = gateway.clock()
    await gateway.db(lambda session: check_budget(gateway, session, user_id, now))


def set_budget(
    session: Session, user_id: str, day_tokens: int | None, month_tokens: int | None
) -> None:
    """Set ``user_id``'s budgets (None: no budget for that period)."""
    if session.get(User, user_id) is None:
        raise NotFound(f"user {user_id!r} not found")
    limits = insert_or_get(session, UserLimits, {"user_id": user_id}, ["user_id"])
    limits.day_tokens = day_tokens
    limits.month_tokens = month_tokens
    session.flush()
