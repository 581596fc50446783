"""What an admin may do over the API: see every user's usage and budgets, set a user's
budgets and quotas, revoke a user's tokens.

The role is checked once, by ``deps.admin_user`` on the whole ``routes/admin.py`` router;
these functions trust their caller for it.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime

from pydantic import BaseModel, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from signalbox.services.gateway.budgets import BudgetOut, budget_out
from signalbox.services.gateway.errors import NotFound
from signalbox.services.gateway.quotas import QuotaName, Quotas
from signalbox.services.gateway.routes.usage import UsageOut
from signalbox.shared.admission import Limits, running_by_user, waiting_by_user
from signalbox.shared.db import User, UserLimits
from signalbox.shared.db.budgets import budget_states
from signalbox.shared.db.concurrency import insert_or_get
from signalbox.shared.db.usage import summarize
from signalbox.shared.db.users import revoke_tokens


class UserUsage(BaseModel):
    """One user's usage (since the asked time) and budgets, as an admin sees them."""

    user_id: str
    name: str
    is_admin: bool
    usage: UsageOut
    budgets: list[BudgetOut]


class QuotaOut(BaseModel):
    """One quota of a user: its limit and what the user holds."""

    name: QuotaName
    limit: int
    held: int


class QuotaReport(BaseModel):
    """A user's quotas."""

    user_id: str
    quotas: list[QuotaOut]


class QuotaChange(BaseModel):
    """Quotas an admin sets for one user; a field left out (or null) keeps the deployment's."""

    conversations: int | None = Field(default=None, ge=0)
    workspaces: int | None = Field(default=None, ge=0)
    uploads: int | None = Field(default=None, ge=0)
    upload_bytes: int | None = Field(default=None, ge=0)
    pending_proposals: int | None = Field(default=None, ge=0)
    workspace_bytes: int | None = Field(default=None, ge=0)


class ShareChange(BaseModel):
    """A user's fair share of the deployment (``shared/admission.py``)."""

    # Turns running at once; null: the deployment's SIGNALBOX_MAX_RUNNING_TURNS_PER_USER;
    # 0: no limit.
    max_running_turns: int | None = Field(default=None, ge=0)
    weight: int | None = Field(default=None, ge=1)  # against other users; null: 1


class ShareReport(BaseModel):
    """A user's share, what applies, and their turns holding or waiting for a slot now."""

    user_id: str
    max_running_turns: int | None
    weight: int | None
    effective_max_running_turns: int  # 0: no limit
    running: int
    waiting: int


def share_report(session: Session, limits: Limits, deployment: str, user_id: str) -> ShareReport:
    """``user_id``'s fair share on ``deployment``."""
    _user(session, user_id)
    own = session.get(UserLimits, user_id)
    max_running = own.max_running_turns if own is not None else None
    return ShareReport(
        user_id=user_id,
        max_running_turns=max_running,
        weight=own.weight if own is not None else None,
        effective_max_running_turns=limits.per_user if max_running is None else max_running,
        running=running_by_user(session, deployment).get(user_id, 0),
        waiting=waiting_by_user(session, deployment).get(user_id, 0),
    )


def set_share(
    session: Session, limits: Limits, deployment: str, user_id: str, change: ShareChange
) -> ShareReport:
    """Replace ``user_id``'s share with ``change``."""
    _user(session, user_id)
    own = insert_or_get(session, UserLimits, {"user_id": user_id}, ["user_id"])
    own.max_running_turns = change.max_running_turns
    own.weight = change.weight
    session.flush()
    return share_report(session, limits, deployment, user_id)


def _user(session: Session, user_id: str) -> User:
    user = session.get(User, user_id)
    if user is None:
        raise NotFound(f"user {user_id!r} not found")
    return user


def all_usage(session: Session, since: datetime | None, now: datetime) -> list[UserUsage]:
    """Every user's usage and budgets, by name."""
    sums = {s.key: s for s in summarize(session, since=since, group_by="user")}
    [empty] = summarize(session, user_id="", since=since)  # no requests: the zero row
    out = []
    for user in session.scalars(select(User).order_by(User.name)):
        found = sums.get(user.id, empty)
        out.append(
            UserUsage(
                user_id=user.id,
                name=user.name,
                is_admin=user.is_admin,
                usage=UsageOut(**{**asdict(found), "key": user.id}),
                budgets=[budget_out(s) for s in budget_states(session, user.id, now)],
            )
        )
    return out


def quota_report(session: Session, quotas: Quotas, user_id: str) -> QuotaReport:
    """``user_id``'s quotas with what they hold."""
    _user(session, user_id)
    limits = quotas.limits_of(session, user_id)
    held = quotas.usage_of(session, user_id)
    return QuotaReport(
        user_id=user_id,
        quotas=[QuotaOut(name=n, limit=limits[n], held=held[n]) for n in limits],
    )


def set_quotas(session: Session, quotas: Quotas, user_id: str, change: QuotaChange) -> QuotaReport:
    """Replace ``user_id``'s own quotas with ``change`` (unset fields: the deployment's)."""
    _user(session, user_id)
    limits = insert_or_get(session, UserLimits, {"user_id": user_id}, ["user_id"])
    limits.quotas = change.model_dump(exclude_none=True) or None
    session.flush()
    return quota_report(session, quotas, user_id)


def revoke_user_tokens(session: Session, user_id: str) -> int:
    """Revoke every live token of ``user_id``; how many."""
    return revoke_tokens(session, _user(session, user_id))
