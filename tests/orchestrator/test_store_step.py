"""``store.store_step``: a model step's message, calls and request row land together. With
no more writes to join them (``then``: webhook deliveries), on PostgreSQL they are one
statement outside any transaction; with them, one transaction. Both leave the same rows."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from psycopg.pq import TransactionStatus
from sqlalchemy import Connection, event, func, select
from sqlalchemy.orm import Session, sessionmaker

from signalbox.services.orchestrator import store
from signalbox.services.orchestrator.model import ToolUse
from signalbox.shared.db.models import Message, ModelRequest, ToolCall, Turn
from tests.orchestrator.support import make_conversation, make_turn


def _turn(sessions: sessionmaker[Session], user_id: str) -> store.TurnInfo:
    conversation_id = make_conversation(sessions, user_id)
    info = store.load_turn(sessions, make_turn(sessions, conversation_id, user_id, "go", seq=1))
    assert info is not None
    store.open_turn(sessions, info, "test-model")
    return info


def _planned(info: store.TurnInfo, n: int) -> list[store.PlannedCall]:
    return [
        store.PlannedCall(ToolUse(f"toolu_{i}", "read_file", {"path": f"f{i}"}), 5.0, "pending")
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
    """Each statement run meanwhile, and on PostgreSQL the connection's transaction status
    just after it (``IDLE``: it ran outside any transaction)."""
    engine = sessions.kw["bind"]
    seen: list[tuple[str, Any]] = []

    def after(conn: Connection, _cursor: Any, statement: str, *_args: Any) -> None:
        dbapi = conn.connection.dbapi_connection
        status = getattr(getattr(dbapi, "info", None), "transaction_status", None)
        seen.append((statement.split()[0].upper(), status))

    event.listen(engine, "after_cursor_execute", after)
    try:
        yield seen
    finally:
        event.remove(engine, "after_cursor_execute", after)


def _stored(sessions: sessionmaker[Session], info: store.TurnInfo) -> dict[str, Any]:
    """What the turn's steps left, ids and clocks aside."""
    with sessions() as s:
        turn = s.get(Turn, info.turn_id)
        assert turn is not None
        messages = s.execute(
            select(Message.seq, Message.step, Message.role, Message.content, Message.input_tokens)
            .where(Message.turn_id == info.turn_id, Message.role == "assistant")
            .order_by(Message.seq)
        ).all()
        calls = s.execute(
            select(ToolCall.position, ToolCall.tool, ToolCall.input, ToolCall.status)
            .where(ToolCall.turn_id == info.turn_id)
            .order_by(ToolCall.message_id, ToolCall.position)
        ).all()
        requests = s.execute(
            select(
                ModelRequest.outcome,
                ModelRequest.input_tokens,
                ModelRequest.cache_read_input_tokens,
                ModelRequest.created_at.is_not(None),
            ).where(ModelRequest.turn_id == info.turn_id)
        ).all()
        return {
            "step": turn.step,
            "tokens": (turn.input_tokens, turn.output_tokens),
            "messages": [tuple(m) for m in messages],
            "calls": [tuple(c) for c in calls],
            "requests": [tuple(r) for r in requests],
        }


def test_a_step_with_no_more_writes_is_one_statement_and_stores_what_a_transaction_does(
    db_sessions: sessionmaker[Session], make_user: Callable[[], tuple[str, str]]
) -> None:
    user_id, _ = make_user()
    alone, joined = _turn(db_sessions, user_id), _turn(db_sessions, user_id)
    then_saw: list[int] = []

    with _watched(db_sessions) as seen:
        for step in (1, 2):
            msg, calls = store.store_step(
                db_sessions, alone, f"step {step}", _planned(alone, 3), 11, 5, _request(alone)
            )
            assert (msg.step, len(calls)) == (step, 3)
    for step in (1, 2):
        store.store_step(
            db_sessions,
            joined,
            f"step {step}",
            _planned(joined, 3),
            11,
            5,
            _request(joined),
            then=lambda _conn, calls: then_saw.append(len(calls)),
        )

    assert then_saw == [3, 3]
    assert _stored(db_sessions, alone) == _stored(db_sessions, joined)
    stored = _stored(db_sessions, alone)
    assert stored["step"] == 2 and stored["tokens"] == (22, 10)
    assert [m[:3] for m in stored["messages"]] == [(2, 1, "assistant"), (3, 2, "assistant")]
    assert len(stored["calls"]) == 6 and stored["requests"] == [("ok", 7, 0, True)] * 2
    if db_sessions.kw["bind"].dialect.name == "postgresql":
        assert seen == [("WITH", TransactionStatus.IDLE)] * 2, seen


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
