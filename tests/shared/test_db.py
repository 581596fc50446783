"""The migrated schema and the token functions, on SQLite or PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import inspect
from sqlalchemy.orm import Session, sessionmaker

from signalbox.shared.db import Base, User
from signalbox.shared.db.users import issue_token, revoke_tokens, user_for_token


def test_migration_creates_every_table_of_the_models(db_sessions: sessionmaker[Session]) -> None:
    with db_sessions() as session:
        tables = set(inspect(session.get_bind()).get_table_names())
    assert set(Base.metadata.tables) <= tables


def test_a_token_finds_its_user_until_revoked(
    db_sessions: sessionmaker[Session], make_user: Callable[[], tuple[str, str]]
) -> None:
    user_id, token = make_user()
    with db_sessions() as session:
        found = user_for_token(session, token)
        assert found is not None and found.id == user_id
        assert user_for_token(session, token + "x") is None
        user = session.get(User, user_id)
        assert user is not None
        second = issue_token(session, user)
        assert revoke_tokens(session, user) == 2
        session.commit()
        assert user_for_token(session, token) is None
        assert user_for_token(session, second) is None
