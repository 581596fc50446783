"""``store.store_step``: a model step's message, calls and request row land together. With
no more writes to join them (``then``: webhook deliveries), on PostgreSQL they are one
statement outside any transaction; with them, one transaction. Both leave the same rows."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

import pytest
from psycopg.pq import TransactionStatus
from sqlalchemy import Connection, Table, event, func, insert, select
from sqlalchemy.orm import Session, sessionmaker

from signalbox.services.orchestrator import store
from signalbox.services.orchestrator.model import ToolUse
from signalbox.shared.db.models import Message, ModelRequest, ToolCall, Turn
from tests.orchestrator.support import make_conversation, make_turn, wait_for


def _turn(sessions: sessionmaker[Session], user_id: str) -> store.TurnInfo:
    conversation_id = make_conversation(sessions, user_id)
    info = store.load_turn(sessions, make_turn(sessions, conversation_id, user_id, "go", seq=1))
    assert info is not None
    store.open_turn(sessions, info, "test-model")
    return info


def _planned(info: store.TurnInfo, n: int) -> list[store.PlannedCall]:
    """``n`` calls: one to run, one waiting on a decision, one denied at once, in turn."""
    kinds = [
        ("pending", None, "server"),
        ("needs_decision", None, "server"),
        ("denied", "not allowed here", "server"),
    ]
    return [
        store.PlannedCall(
            ToolUse(f"toolu_{i}", f"tool_{i}", {"path": f"f{i}", "n": i}),
            5.0 + i,
            kinds[i % 3][0],
            kinds[i % 3][1],
            kinds[i % 3][2],
            decision_ttl_s=60.0,
        )
        for i in range(n)
    ]


def _request(info: store.TurnInfo) -> ModelRequest:
    """A request row as ``usage.request_row`` leaves it: the defaulted columns unset."""
    return ModelRequest(
        user_id=info.user_id,
        conversation_id=info.conversation_id,
        turn_id=info.turn_id,
        root_turn_id=info.turn_id,
        purpose="step",
        model="test-model",
        input_tokens=7,
        output_tokens=3,
    )


@contextmanager
def _watched(sessions: sessionmaker[Session]) -> Iterator[list[tuple[str, Any]]]:
    """Each statement this thread runs meanwhile, and on PostgreSQL the connection's
    transaction status just after it (``IDLE``: it ran outside any transaction)."""
    engine = sessions.kw["bind"]
    seen: list[tuple[str, Any]] = []
    me = threading.get_ident()

    def after(conn: Connection, _cursor: Any, statement: str, *_args: Any) -> None:
        if threading.get_ident() != me:
            return
        dbapi = conn.connection.dbapi_connection
        status = getattr(getattr(dbapi, "info", None), "transaction_status", None)
        seen.append((statement.split()[0].upper(), status))

    event.listen(engine, "after_cursor_execute", after)
    try:
        yield seen
    finally:
        event.remove(engine, "after_cursor_execute", after)


_CLOCKS = {"created_at", "expires_at", "finished_at", "started_at"}


def _row(row: Any, leave: set[str]) -> dict[str, Any]:
    """A row's columns but ``leave`` and its clocks (whether each is set, kept)."""
    found = {}
    for key, value in row._mapping.items():
        if key in _CLOCKS:
            found[key] = value is not None
        elif key not in leave:
            found[key] = value
    return found


def _stored(sessions: sessionmaker[Session], info: store.TurnInfo) -> dict[str, Any]:
    """Every column the turn's steps wrote, ids and clocks aside (a call by its message's
    seq and its position)."""
    messages, calls, requests = (
        cast(Table, Message.__table__),
        cast(Table, ToolCall.__table__),
        cast(Table, ModelRequest.__table__),
    )
    with sessions() as s:
        turn = s.get(Turn, info.turn_id)
        assert turn is not None
        return {
            "turn": (turn.step, turn.input_tokens, turn.output_tokens),
            "messages": [
                _row(m, {"id", "conversation_id", "turn_id"})
                for m in s.execute(
                    select(messages)
                    .where(messages.c.turn_id == info.turn_id, messages.c.role == "assistant")
                    .order_by(messages.c.seq)
                )
            ],
            "calls": [
                _row(c, {"id", "turn_id", "message_id"})
                for c in s.execute(
                    select(calls, messages.c.seq)
                    .join(messages, messages.c.id == calls.c.message_id)
                    .where(calls.c.turn_id == info.turn_id)
                    .order_by(messages.c.seq, calls.c.position)
                )
            ],
            "requests": [
                _row(r, {"id", "conversation_id", "turn_id", "root_turn_id", "user_id"})
                for r in s.execute(
                    select(requests)
                    .where(requests.c.turn_id == info.turn_id)
                    .order_by(requests.c.id)
                )
            ],
        }


def _steps(
    sessions: sessionmaker[Session],
    info: store.TurnInfo,
    then: Callable[[Connection, Sequence[ToolCall]], object] | None,
) -> None:
    """Three steps: three calls (one of each kind) with a request row; none with one; two
    calls with none (a request row is left out on a cancelled step)."""
    for number, calls, request in ((1, 3, True), (2, 0, True), (3, 2, False)):
        msg, stored = store.store_step(
            sessions,
            info,
            f"step {number}",
            _planned(info, calls),
            11,
            5,
            _request(info) if request else None,
            [{"type": "thinking", "thinking": "hm", "signature": "sig"}] if number == 1 else (),
            then=then,
        )
        assert (msg.step, len(stored)) == (number, calls)


def test_a_step_with_no_more_writes_is_one_statement_and_stores_what_a_transaction_does(
    db_sessions: sessionmaker[Session], make_user: Callable[[], tuple[str, str]]
) -> None:
    user_id, _ = make_user()
    alone, joined = _turn(db_sessions, user_id), _turn(db_sessions, user_id)
    then_saw: list[int] = []

    with _watched(db_sessions) as seen:
        _steps(db_sessions, alone, None)
    _steps(db_sessions, joined, lambda _conn, calls: then_saw.append(len(calls)))

    assert then_saw == [3, 0, 2]
    stored = _stored(db_sessions, alone)
    assert stored == _stored(db_sessions, joined)
    assert stored["turn"] == (3, 33, 15)
    assert [(m["seq"], m["step"]) for m in stored["messages"]] == [(2, 1), (3, 2), (4, 3)]
    assert stored["messages"][0]["content"][0]["signature"] == "sig"
    assert [(c["seq"], c["position"], c["status"]) for c in stored["calls"]] == [
        (2, 0, "pending"),
        (2, 1, "needs_decision"),
        (2, 2, "denied"),
        (4, 0, "pending"),
        (4, 1, "needs_decision"),
    ]
    assert stored["calls"][1]["expires_at"] and stored["calls"][2]["finished_at"]
    assert stored["calls"][2]["error"] == "not allowed here"
    assert [r["outcome"] for r in stored["requests"]] == ["ok", "ok"]
    assert all(r["created_at"] and r["cache_read_input_tokens"] == 0 for r in stored["requests"])
    if db_sessions.kw["bind"].dialect.name == "postgresql":
        assert seen == [("WITH", TransactionStatus.IDLE)] * 3, seen


def test_a_step_whose_seq_another_runner_took_while_it_waited_is_stored_after_it(
    db_sessions: sessionmaker[Session], make_user: Callable[[], tuple[str, str]]
) -> None:
    """Two runners of one turn (a lease lost): the second's statement waits on the turn's
    row while the first commits a message; its snapshot, older, gives it the same seq. It
    is stored all the same, after the first, with nothing of it written twice."""
    if db_sessions.kw["bind"].dialect.name != "postgresql":
        pytest.skip("one statement in autocommit is PostgreSQL's path")
    user_id, _ = make_user()
    info = _turn(db_sessions, user_id)
    engine = db_sessions.kw["bind"]
    outcome: list[object] = []

    with engine.connect() as first:
        first.execute(select(Turn.id).where(Turn.id == info.turn_id).with_for_update())
        pid = first.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()

        def second() -> None:
            try:
                outcome.append(
                    store.store_step(db_sessions, info, "second", _planned(info, 2), 1, 1)
                )
            except Exception as exc:  # the test's failure, reported below
                outcome.append(exc)

        thread = threading.Thread(target=second)
        thread.start()
        _wait_until_blocked_by(engine, pid, thread)
        seq = first.scalar(
            select(func.max(Message.seq)).where(Message.conversation_id == info.conversation_id)
        )
        first.execute(
            insert(Message).values(
                id="msg_first_runner",
                conversation_id=info.conversation_id,
                turn_id=info.turn_id,
                seq=(seq or 0) + 1,
                step=1,
                role="assistant",
                content=[{"type": "text", "text": "first"}],
                created_at=store.utcnow(),
            )
        )
        first.commit()
    thread.join(timeout=30)

    assert len(outcome) == 1 and not isinstance(outcome[0], Exception), outcome
    msg, calls = cast(tuple[Message, list[ToolCall]], outcome[0])
    assert msg.seq == (seq or 0) + 2 and len(calls) == 2
    stored = _stored(db_sessions, info)
    assert [(m["seq"], m["content"][0]["text"]) for m in stored["messages"]] == [
        ((seq or 0) + 1, "first"),
        ((seq or 0) + 2, "second"),
    ]
    assert [c["seq"] for c in stored["calls"]] == [msg.seq, msg.seq]


def _wait_until_blocked_by(engine: Any, pid: int, thread: threading.Thread) -> None:
    """Until a backend of ``engine``'s server waits on a lock ``pid`` holds (``thread``
    ending first fails the test)."""
    with engine.connect() as probe:

        def blocked() -> bool:
            assert thread.is_alive(), "the second runner did not wait on the turn's row"
            count = probe.exec_driver_sql(
                "SELECT count(*) FROM pg_stat_activity WHERE %(pid)s = ANY(pg_blocking_pids(pid))",
                {"pid": pid},
            ).scalar_one()
            probe.rollback()
            return bool(count)

        wait_for(blocked, timeout_s=30, what="the second runner to wait on the turn's row")


def test_a_step_of_a_turn_that_is_not_there_writes_nothing(
    db_sessions: sessionmaker[Session], make_user: Callable[[], tuple[str, str]]
) -> None:
    user_id, _ = make_user()
    real = _turn(db_sessions, user_id)
    gone = store.TurnInfo(
        turn_id="turn_not_there",
        conversation_id=real.conversation_id,
        user_id=user_id,
        workspace="default",
        seq=2,
        status="running",
    )

    with pytest.raises(LookupError):
        store.store_step(db_sessions, gone, "orphan", _planned(gone, 2), 1, 1, _request(gone))

    with db_sessions() as s:
        for table, column in (
            (Message, Message.turn_id),
            (ToolCall, ToolCall.turn_id),
            (ModelRequest, ModelRequest.turn_id),
        ):
            found = s.scalar(select(func.count()).select_from(table).where(column == gone.turn_id))
            assert found == 0, table
