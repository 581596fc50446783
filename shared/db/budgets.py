"""Token budgets per user and UTC period, counted from ``model_requests``.

The orchestrator (which ends a turn that crosses one) and the gateway (which refuses a turn
that would start over one, and shows budgets) both read them here. Every function takes
``now``: the caller's clock, which tests control, so no test sleeps to cross a period.

What counts is every token a request billed: its prompt (uncached, written to the cache,
read from it) and its output, of every purpose (steps, sub-agents, planner, compaction).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from signalbox.shared.db.models import ModelRequest
from signalbox.shared.db.tenancy import own_limits

Period = Literal["day", "month"]
PERIODS: tuple[Period, ...] = ("day", "month")
_ADJECTIVE: dict[Period, str] = {"day": "daily", "month": "monthly"}


def period_start(period: Period, now: datetime) -> datetime:
    """The UTC start of the ``period`` holding ``now``: midnight, or the 1st of the month."""
    moment = now.astimezone(UTC)
    day = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    return day if period == "day" else day.replace(day=1)


def period_end(period: Period, now: datetime) -> datetime:
    """The UTC start of the next ``period``: when a budget resets."""
    start = period_start(period, now)
    if period == "day":
        return datetime.fromordinal(start.toordinal() + 1).replace(tzinfo=UTC)
    if start.month == 12:
        return start.replace(year=start.year + 1, month=1)
    return start.replace(month=start.month + 1)


def tokens_used(session: Session, user_id: str, since: datetime) -> int:
    """Tokens of ``user_id``'s model requests recorded at or after ``since``."""
    total = session.scalar(
        select(
            func.coalesce(
                func.sum(
                    ModelRequest.input_tokens
                    + ModelRequest.output_tokens
                    + ModelRequest.cache_creation_input_tokens
                    + ModelRequest.cache_read_input_tokens
                ),
                0,
            )
        ).where(ModelRequest.user_id == user_id, ModelRequest.created_at >= since)
    )
    return int(total or 0)


@dataclass(frozen=True)
class BudgetState:
    """One budget of one user right now."""

    period: Period
    limit_tokens: int
    used_tokens: int
    period_start: datetime
    resets_at: datetime

    @property
    def exceeded(self) -> bool:
        """Whether the period's tokens are used up (a turn may not start, a step not follow)."""
        return self.used_tokens >= self.limit_tokens

    def describe(self) -> str:
        """The sentence a refusal or an ended turn carries."""
        return (
            f"the {_ADJECTIVE[self.period]} token budget of {self.limit_tokens} is used up "
            f"({self.used_tokens} used); it resets at {self.resets_at.isoformat()}"
        )


def budget_limits(session: Session, user_id: str) -> dict[Period, int]:
    """The budgets set for ``user_id``, by period (none: empty)."""
    limits = own_limits(session, user_id)
    if limits is None:
        return {}
    found: dict[Period, int | None] = {"day": limits.day_tokens, "month": limits.month_tokens}
    return {period: value for period, value in found.items() if value is not None}


def budget_states(session: Session, user_id: str, now: datetime) -> list[BudgetState]:
    """Each budget of ``user_id`` with what the current period used so far."""
    states = []
    for period, limit in budget_limits(session, user_id).items():
        start = period_start(period, now)
        used = tokens_used(session, user_id, start)
        states.append(BudgetState(period, limit, used, start, period_end(period, now)))
    return states


def exceeded_budget(session: Session, user_id: str, now: datetime) -> BudgetState | None:
    """The first of ``user_id``'s budgets that is used up, or None."""
    return next((s for s in budget_states(session, user_id, now) if s.exceeded), None)
