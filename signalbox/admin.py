"""Admin work on the SQL database: migrations and users with their API tokens.

Plain functions taking a database URL, so ``signalbox`` subcommands stay thin and tests
can call the same code the command runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError
from sqlalchemy.orm import Session

from signalbox.shared.db import ApiToken, User, UserLimits, make_engine, make_session_factory
from signalbox.shared.db.concurrency import insert_or_get
from signalbox.shared.db.users import create_user, issue_token, revoke_tokens


class AdminError(RuntimeError):
    """An admin command that cannot be done; the message is shown to the operator."""


@dataclass(frozen=True)
class UserRow:
    """One line of ``signalbox users list``."""

    name: str
    user_id: str
    created_at: datetime
    live_tokens: int
    is_admin: bool = False


def safe_url(database_url: str) -> str:
    """``database_url`` with any password masked, fit for printing."""
    return make_engine(database_url).url.render_as_string(hide_password=True)


def migrate(database_url: str) -> None:
    """Bring the database up to the newest schema."""
    from signalbox.shared.db.migrate import (
        upgrade,
    )  # alembic is slow to import and only needed here

    upgrade(database_url)


@contextmanager
def session_for(database_url: str) -> Iterator[Session]:
    """A session on ``database_url`` that commits on success; a missing schema is named."""
    engine = make_engine(database_url)
    try:
        with make_session_factory(engine)() as session:
            try:
                yield session
                session.commit()
            except (OperationalError, ProgrammingError) as exc:
                if "no such table" in str(exc) or "does not exist" in str(exc):
                    raise AdminError(
                        f"the database at {safe_url(database_url)} has no Signalbox schema: "
                        "run `signalbox migrate` first"
                    ) from None
                # Most often: run outside the directory of `signalbox up`, whose database
                # is the relative default sqlite:///var/signalbox.db.
                raise AdminError(
                    f"cannot use the database at {safe_url(database_url)}: {exc.orig}. Run this "
                    "from the directory you ran `signalbox up` in, or set "
                    "SIGNALBOX_DATABASE_URL"
                ) from None
    finally:
        engine.dispose()


def _user_named(session: Session, name: str) -> User:
    user = session.scalars(select(User).where(User.name == name)).one_or_none()
    if user is None:
        raise AdminError(f"no user named {name!r}")
    return user


def add_user(database_url: str, name: str, is_admin: bool = False) -> str:
    """Create user ``name`` (an admin if ``is_admin``) and return its first token."""
    if not name.strip() or len(name) > 100:
        raise AdminError(f"expected a user name of 1-100 characters, got {name!r}")
    try:
        with session_for(database_url) as session:
            user, token = create_user(session, name)
            user.is_admin = is_admin
            return token
    except IntegrityError:
        raise AdminError(f"a user named {name!r} already exists") from None


def new_token(database_url: str, name: str) -> str:
    """Issue another token for an existing user (its other tokens stay valid)."""
    with session_for(database_url) as session:
        return issue_token(session, _user_named(session, name))


def revoke_user_tokens(database_url: str, name: str) -> int:
    """Revoke every token of user ``name``; returns how many were live."""
    with session_for(database_url) as session:
        return revoke_tokens(session, _user_named(session, name))


def set_admin(database_url: str, name: str, is_admin: bool) -> None:
    """Give user ``name`` the admin role, or take it away."""
    with session_for(database_url) as session:
        _user_named(session, name).is_admin = is_admin


def set_budget(
    database_url: str, name: str, day_tokens: int | None, month_tokens: int | None
) -> None:
    """Set user ``name``'s token budgets per UTC day and month (None: no budget)."""
    for value in (day_tokens, month_tokens):
        if value is not None and value < 0:
            raise AdminError(f"expected a budget of 0 tokens or more, got {value}")
    with session_for(database_url) as session:
        user = _user_named(session, name)
        limits = insert_or_get(session, UserLimits, {"user_id": user.id}, ["user_id"])
        limits.day_tokens = day_tokens
        limits.month_tokens = month_tokens


def set_share(database_url: str, name: str, running_turns: int | None, weight: int | None) -> None:
    """Set user ``name``'s fair-scheduling share (shared/admission.py): turns running at
    once (None: the deployment's; 0: no limit) and weight (None: 1)."""
    if running_turns is not None and running_turns < 0:
        raise AdminError(f"expected 0 running turns or more, got {running_turns}")
    if weight is not None and weight < 1:
        raise AdminError(f"expected a weight of 1 or more, got {weight}")
    with session_for(database_url) as session:
        user = _user_named(session, name)
        limits = insert_or_get(session, UserLimits, {"user_id": user.id}, ["user_id"])
        limits.max_running_turns = running_turns
        limits.weight = weight


def list_users(database_url: str) -> list[UserRow]:
    """Every user with the number of its live tokens, oldest first."""
    live = (
        select(ApiToken.user_id, func.count().label("n"))
        .where(ApiToken.revoked_at.is_(None))
        .group_by(ApiToken.user_id)
        .subquery()
    )
    with session_for(database_url) as session:
        rows = session.execute(
            select(User, func.coalesce(live.c.n, 0))
            .outerjoin(live, live.c.user_id == User.id)
            .order_by(User.created_at, User.name)
        ).all()
        return [
            UserRow(
                name=u.name,
                user_id=u.id,
                created_at=u.created_at,
                live_tokens=int(n),
                is_admin=u.is_admin,
            )
            for u, n in rows
        ]
