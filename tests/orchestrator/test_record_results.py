"""``store.record_results``: a read's results end their calls in one statement, each call
once, the first result of a call standing."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from psycopg.pq import TransactionStatus
from sqlalchemy import Connection, event, update
from sqlalchemy.orm import Session, sessionmaker

from signalbox.services.orchestrator import store
from signalbox.services.orchestrator.model import ToolUse
from signalbox.shared.db.models import ToolCall
from tests.orchestrator.support import make_conversation, make_turn


def _calls(sessions: sessionmaker[Session], user_id: str, n: int) -> list[ToolCall]:
    conversation_id = make_conversation(sessions, user_id)
    info = store.load_turn(sessions, make_turn(sessions, conversation_id, user_id, "go", seq=1))
    assert info is not None
    store.open_turn(sessions, info, "test-model")
    planned = [
        store.PlannedCall(ToolUse(f"toolu_{info.turn_id}_{i}", "read_file", {}), 5.0, "pending")
        for i in range(n)
    ]
    _message, calls = store.store_step(sessions, info, "calling", planned, 3, 2)
    return calls


def test_one_statement_ends_every_open_call_of_a_read_each_once(
    db_sessions: sessionmaker[Session], make_user: Callable[[], tuple[str, str]]
) -> None:
    user_id, _ = make_user()
    a, b, c, done = _calls(db_sessions, user_id, 4)
    started = store.utcnow() - timedelta(seconds=2)
    with db_sessions() as s, s.begin():
        s.execute(update(ToolCall).where(ToolCall.id == c.id).values(started_at=started))
    store.record_results(db_sessions, [store.ResultRow(done.id, "ok", "earlier", None, 5)])

    engine = db_sessions.kw["bind"]
    statements: list[str] = []

    def count(*args: object) -> None:
        statements.append(str(args[2]).split()[0].upper())

    event.listen(engine, "before_cursor_execute", count)
    try:
        ended = store.record_results(
            db_sessions,
            [
                store.ResultRow(a.id, "ok", "a's output", None, 10),
                store.ResultRow(b.id, "error", "", "it broke", 20),
                store.ResultRow(a.id, "error", "", "a second result for a", 30),
                store.ResultRow(c.id, "timeout", "", "too slow", None),  # measured
                store.ResultRow(done.id, "error", "", "ended already", 40),
            ],
        )
    finally:
        event.remove(engine, "before_cursor_execute", count)

    assert [(e.id, e.status, e.output, e.error) for e in ended] == [
        (a.id, "ok", "a's output", None),
        (b.id, "error", "", "it broke"),
        (c.id, "timeout", "", "too slow"),
    ]
    assert [e.duration_ms for e in ended[:2]] == [10, 20]
    assert ended[2].duration_ms is not None and ended[2].duration_ms >= 2000
    assert all(e.tool == "read_file" for e in ended)
    assert statements.count("UPDATE") == 1, statements
    with db_sessions() as s:
        rows = {
            call.id: (call.status, call.output, call.error, call.duration_ms)
            for call in s.query(ToolCall).where(ToolCall.id.in_([a.id, b.id, c.id, done.id]))
        }
    assert rows[a.id] == ("ok", "a's output", None, 10)
    assert rows[b.id] == ("error", "", "it broke", 20)
    assert rows[c.id][:3] == ("timeout", "", "too slow")
    assert rows[done.id] == ("ok", "earlier", None, 5), "an ended call keeps its result"


def test_a_read_of_more_results_than_one_statement_takes_ends_each_call_with_its_own(
    db_sessions: sessionmaker[Session], make_user: Callable[[], tuple[str, str]]
) -> None:
    """Past ``_END_BATCH`` results the statements split; every call still gets its own
    status, output, error and duration, and a call in the later statement that had ended
    keeps its result."""
    user_id, _ = make_user()
    n = store._END_BATCH * 2 + 3
    calls = _calls(db_sessions, user_id, n)
    last = calls[-1]
    store.record_results(db_sessions, [store.ResultRow(last.id, "ok", "first", None, 1)])

    ended = store.record_results(
        db_sessions,
        [
            store.ResultRow(call.id, "ok" if i % 2 else "error", f"out {i}", f"err {i}", i)
            for i, call in enumerate(calls)
        ],
    )

    assert [e.id for e in ended] == [call.id for call in calls[:-1]]
    with db_sessions() as s:
        rows = {
            call.id: (call.status, call.output, call.error, call.duration_ms)
            for call in s.query(ToolCall).where(ToolCall.id.in_([c.id for c in calls]))
        }
    for i, call in enumerate(calls[:-1]):
        assert rows[call.id] == ("ok" if i % 2 else "error", f"out {i}", f"err {i}", i)
    assert rows[last.id] == ("ok", "first", None, 1)


def test_results_with_no_more_writes_end_outside_a_transaction_and_with_them_inside_one(
    db_sessions: sessionmaker[Session], make_user: Callable[[], tuple[str, str]]
) -> None:
    """On PostgreSQL a read's results with nothing to join them are one ``UPDATE`` in
    autocommit (no ``BEGIN``/``COMMIT``); ``then``'s writes share the ``UPDATE``'s
    transaction (it is open when ``then`` runs)."""
    user_id, _ = make_user()
    a, b = _calls(db_sessions, user_id, 2)
    engine = db_sessions.kw["bind"]
    postgres = engine.dialect.name == "postgresql"
    statuses: list[object] = []

    def status(conn: Connection, *_args: object) -> None:
        info = getattr(conn.connection.dbapi_connection, "info", None)
        statuses.append(getattr(info, "transaction_status", None))

    in_then: list[bool] = []
    event.listen(engine, "after_cursor_execute", status)
    try:
        alone = store.record_results(db_sessions, [store.ResultRow(a.id, "ok", "a", None, 1)])
        joined = store.record_results(
            db_sessions,
            [store.ResultRow(b.id, "ok", "b", None, 2)],
            then=lambda conn, ended: in_then.append(conn.in_transaction() and len(ended) == 1),
        )
    finally:
        event.remove(engine, "after_cursor_execute", status)

    assert [e.id for e in alone] == [a.id] and [e.id for e in joined] == [b.id]
    assert in_then == [True]
    if postgres:
        assert statuses == [TransactionStatus.IDLE, TransactionStatus.INTRANS], statuses
