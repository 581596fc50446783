"""Per-user limits of a multi-user deployment: token budgets, quota overrides, and the
once-per-period marks of budget warnings.

``users.is_admin`` (the admin role) is a column of ``users`` itself
(``signalbox.shared.db.models``).
A user without a ``user_limits`` row has no budget and the deployment's quotas.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, Integer, String, bindparam, event, select
from sqlalchemy.orm import Mapped, ORMExecuteState, Session, mapped_column

from signalbox.shared.db.concurrency import per_transaction
from signalbox.shared.db.models import Base, User, now


class UserLimits(Base):
    """What an admin set for one user: token budgets per UTC period and quota overrides."""

    __tablename__ = "user_limits"

    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"), primary_key=True)
    # Tokens (prompt, cached or not, plus output) the user's model requests may use per UTC
    # day / calendar month; null: no budget for that period.
    day_tokens: Mapped[int | None] = mapped_column(Integer, default=None)
    month_tokens: Mapped[int | None] = mapped_column(Integer, default=None)
    # Quota name -> limit, over the deployment's SIGNALBOX_QUOTA_* (services/gateway/quotas.py).
    quotas: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    # Fair scheduling (shared/admission.py): turns running at once (null: the deployment's
    # SIGNALBOX_MAX_RUNNING_TURNS_PER_USER) and the user's share weight (null: 1).
    max_running_turns: Mapped[int | None] = mapped_column(Integer, default=None)
    weight: Mapped[int | None] = mapped_column(Integer, default=None)
    updated_at: Mapped[datetime] = mapped_column(default=now, onupdate=now)


def own_limits(session: Session, user_id: str) -> UserLimits | None:
    """``user_id``'s ``user_limits`` row, or None (the deployment's limits apply), read once
    per transaction.

    A submission asks for it up to three times (its budget, then the quota of conversations
    and of workspaces), and most users have no row: the Session's identity map keeps no
    "absent", nor an object nobody holds, so each ``session.get`` was a ``SELECT``. The
    first answer stands for the transaction until this Session writes a ``user_limits`` row
    (a flush, or an ORM ``insert``/``update``/``delete`` statement: ``_limits_written``);
    then the next call reads again.
    """
    seen = per_transaction(session, _OWN_LIMITS)
    if user_id not in seen:
        seen[user_id] = session.get(UserLimits, user_id)
    found: UserLimits | None = seen[user_id]
    return found


_OWN_LIMITS = "own_limits"


def user_with_limits(session: Session, user_id: str) -> User | None:
    """``user_id``'s user, and its ``user_limits`` row in the same statement, which then
    answers ``own_limits`` for the transaction (a turn's submission reads both: its budget
    check, a new conversation's quotas); None if there is no such user."""
    row = session.execute(_USER_WITH_LIMITS, {"user_id": user_id}).first()
    if row is None:
        return None
    user, limits = row
    per_transaction(session, _OWN_LIMITS)[user_id] = limits
    found: User = user
    return found


def _limits_written(session: Session) -> None:
    """Forget what ``own_limits`` read in ``session``'s transaction."""
    seen = per_transaction(session, _OWN_LIMITS)
    seen.clear()


@event.listens_for(Session, "before_flush")
def _flushing(session: Session, _context: Any, _instances: Any) -> None:
    if any(isinstance(o, UserLimits) for o in (*session.new, *session.dirty, *session.deleted)):
        _limits_written(session)


@event.listens_for(Session, "do_orm_execute")
def _executing(state: ORMExecuteState) -> None:
    if state.is_select or state.bind_mapper is None:
        return
    if state.bind_mapper.class_ is UserLimits:
        _limits_written(state.session)


class BudgetWarning(Base):
    """A ``budget_warning`` sent: one row per (user, period, period start), so the warning
    goes out once per period however many orchestrators see the threshold crossed."""

    __tablename__ = "budget_warnings"

    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"), primary_key=True)
    period: Mapped[str] = mapped_column(String(8), primary_key=True)  # day | month
    period_start: Mapped[datetime] = mapped_column(primary_key=True)
    created_at: Mapped[datetime] = mapped_column(default=now)


class AdmissionLock(Base):
    """One row every admission pass updates first: passes of every gateway, orchestrator and
    scheduler serialise on it (PostgreSQL: its row lock; SQLite: the write lock)."""

    __tablename__ = "admission_lock"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    passes: Mapped[int] = mapped_column(Integer, default=0)


_USER_WITH_LIMITS = (
    select(User, UserLimits)
    .outerjoin(UserLimits, UserLimits.user_id == User.id)
    .where(User.id == bindparam("user_id"))
)
