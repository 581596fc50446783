"""insert_or_get and lock_row hammered from threads at once, on SQLite or PostgreSQL.

The race of issue 12 (finding 5): a new user's first sends all create the ``default``
workspace; a "select, then insert if missing" made all but one fail with IntegrityError.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import delete, event, func, select
from sqlalchemy.orm import Session, sessionmaker

from signalbox.shared.db import Conversation, User, UserLimits, Workspace
from signalbox.shared.db.concurrency import insert_if_missing, insert_or_get, lock_row
from signalbox.shared.db.tenancy import own_limits
from signalbox.shared.ids import new_id

THREADS = 16
BARRIER_TIMEOUT_S = 30.0

T = TypeVar("T")


def _at_once(sessions: sessionmaker[Session], work: Callable[[Session], T]) -> list[T]:
    """``work`` in ``THREADS`` threads, each in its own committed session, released together."""
    barrier = threading.Barrier(THREADS, timeout=BARRIER_TIMEOUT_S)

    def one(_: int) -> T:
        with sessions() as session:
            barrier.wait()
            result = work(session)
            session.commit()
            return result

    with ThreadPoolExecutor(THREADS) as pool:
        return list(pool.map(one, range(THREADS)))


def test_insert_or_get_from_many_threads_makes_one_row(
    db_sessions: sessionmaker[Session], make_user: Callable[[], tuple[str, str]]
) -> None:
    user_id, _ = make_user()

    def ensure(session: Session) -> str:
        values = {"id": new_id("ws"), "user_id": user_id, "name": "default"}
        return insert_or_get(session, Workspace, values, key=("user_id", "name")).id

    ids = _at_once(db_sessions, ensure)
    assert len(set(ids)) == 1
    with db_sessions() as session:
        rows = session.scalars(select(Workspace).where(Workspace.user_id == user_id)).all()
    assert [r.id for r in rows] == ids[:1]


def test_insert_or_get_returns_the_existing_row_unchanged(
    db_sessions: sessionmaker[Session], make_user: Callable[[], tuple[str, str]]
) -> None:
    user_id, _ = make_user()
    with db_sessions() as session:
        first = insert_or_get(
            session,
            Workspace,
            {"id": "ws_first", "user_id": user_id, "name": "w"},
            ("user_id", "name"),
        )
        again = insert_or_get(
            session,
            Workspace,
            {"id": "ws_again", "user_id": user_id, "name": "w"},
            ("user_id", "name"),
        )
        session.commit()
    assert first.id == again.id == "ws_first"


def test_insert_if_missing_from_many_threads_makes_one_row_and_keeps_it(
    db_sessions: sessionmaker[Session], make_user: Callable[[], tuple[str, str]]
) -> None:
    user_id, _ = make_user()
    tried: list[str] = []

    def ensure(session: Session) -> str:
        values = {"id": new_id("ws"), "user_id": user_id, "name": "default"}
        tried.append(values["id"])
        insert_if_missing(session, Workspace, values, key=("user_id", "name"))
        return values["id"]

    _at_once(db_sessions, ensure)
    with db_sessions() as session:
        rows = session.scalars(select(Workspace).where(Workspace.user_id == user_id)).all()
        assert len(rows) == 1 and rows[0].id in tried
        insert_if_missing(
            session,
            Workspace,
            {"id": "ws_late", "user_id": user_id, "name": "default"},
            ("user_id", "name"),
        )
        session.commit()
        again = session.scalars(select(Workspace).where(Workspace.user_id == user_id)).all()
    assert [r.id for r in again] == [rows[0].id]  # the row that was there, unchanged


def test_lock_row_serialises_a_read_then_write(
    db_sessions: sessionmaker[Session], make_user: Callable[[], tuple[str, str]]
) -> None:
    """Each thread writes only if nobody did before it: under the lock exactly one does."""
    user_id, _ = make_user()

    def first_one_writes(session: Session) -> bool:
        assert lock_row(session, User, user_id)
        seen = session.scalar(
            select(func.count()).select_from(Conversation).where(Conversation.user_id == user_id)
        )
        if seen:
            return False
        session.add(Conversation(id=new_id("conv"), user_id=user_id, workspace="default"))
        session.flush()
        return True

    wrote = _at_once(db_sessions, first_one_writes)
    assert wrote.count(True) == 1
    with db_sessions() as session:
        assert not lock_row(session, User, "user_nobody")


@contextmanager
def _statements(session: Session, starting: str, user_id: str) -> Iterator[list[str]]:
    """The statements ``session``'s engine sends, while in the block, that start with
    ``starting`` and name ``user_id`` among their parameters."""
    sent: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if statement.startswith(starting) and user_id in str(parameters):
            sent.append(statement)

    engine = session.get_bind()
    event.listen(engine, "before_cursor_execute", seen)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", seen)


def test_lock_row_asks_the_server_once_per_transaction(
    db_sessions: sessionmaker[Session], make_user: Callable[[], tuple[str, str]]
) -> None:
    user_id, _ = make_user()
    with db_sessions() as session, _statements(session, "UPDATE users", user_id) as sent:
        assert lock_row(session, User, user_id) and lock_row(session, User, user_id)
        assert len(sent) == 1  # held already: the second call sends nothing
        session.commit()
        assert lock_row(session, User, user_id)  # a new transaction: taken again
        assert len(sent) == 2
        session.rollback()
        with session.begin_nested() as savepoint:
            assert lock_row(session, User, user_id)
            savepoint.rollback()  # which releases a lock the savepoint took
        assert lock_row(session, User, user_id)
        assert len(sent) == 4
        assert not lock_row(session, User, "user_nobody")
        assert not lock_row(session, User, "user_nobody")
        session.commit()


def test_own_limits_is_read_once_per_transaction_and_sees_what_it_wrote(
    db_sessions: sessionmaker[Session], make_user: Callable[[], tuple[str, str]]
) -> None:
    user_id, _ = make_user()
    with db_sessions() as session, _statements(session, "SELECT", user_id) as reads:
        assert own_limits(session, user_id) is None
        assert own_limits(session, user_id) is None
        assert len(reads) == 1  # the absent row, remembered for the transaction
        written = insert_or_get(
            session, UserLimits, {"user_id": user_id, "day_tokens": 7}, ["user_id"]
        )
        reads.clear()
        assert own_limits(session, user_id) is written  # its own write, no statement
        assert reads == []
        session.commit()
        assert "signalbox_per_transaction" not in session.info  # gone with its transaction
        session.expunge_all()  # the Session holds nothing: a new transaction must ask
        found = own_limits(session, user_id)
        assert found is not None and found.day_tokens == 7 and len(reads) == 1
        session.commit()


def test_own_limits_reads_again_after_the_transaction_writes_the_row(
    db_sessions: sessionmaker[Session], make_user: Callable[[], tuple[str, str]]
) -> None:
    # A row flushed and let go (no object holds it, so the identity map lets it go too) must
    # not leave the "absent" read before it standing.
    user_id, _ = make_user()
    with db_sessions() as session:
        assert own_limits(session, user_id) is None
        session.add(UserLimits(user_id=user_id, day_tokens=3))
        session.flush()
        session.expunge_all()
        found = own_limits(session, user_id)
        assert found is not None and found.day_tokens == 3
        session.execute(delete(UserLimits).where(UserLimits.user_id == user_id))
        assert own_limits(session, user_id) is None  # and a row deleted since is gone
        session.rollback()
