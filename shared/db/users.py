"""Users and their API tokens: create, issue, look up by bearer token."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from signalbox.shared.auth import hash_token, new_token
from signalbox.shared.db.models import ApiToken, User, now
from signalbox.shared.ids import new_id


def create_user(session: Session, name: str) -> tuple[User, str]:
    """Create user ``name`` and return it with a fresh token (shown once, stored hashed)."""
    user = User(id=new_id("user"), name=name)
    session.add(user)
    session.flush()
    return user, issue_token(session, user)


def issue_token(session: Session, user: User) -> str:
    """A new token for ``user``."""
    token = new_token()
    session.add(ApiToken(id=new_id("tok"), user_id=user.id, token_hash=hash_token(token)))
    session.flush()
    return token


def user_for_token(session: Session, token: str) -> User | None:
    """The user a live token belongs to, or None."""
    row = session.execute(
        select(User)
        .join(ApiToken, ApiToken.user_id == User.id)
        .where(ApiToken.token_hash == hash_token(token), ApiToken.revoked_at.is_(None))
    ).scalar_one_or_none()
    return row


def revoke_tokens(session: Session, user: User) -> int:
    """Revoke every token of ``user``; returns how many."""
    tokens = session.scalars(
        select(ApiToken).where(ApiToken.user_id == user.id, ApiToken.revoked_at.is_(None))
    ).all()
    for t in tokens:
        t.revoked_at = now()
    return len(tokens)
