"""``store.open_turn``: a queued turn starts once, with its user's text as the next message of
the conversation; a cancelled or started turn is reported as found and left alone."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from signalbox.services.orchestrator import store
from signalbox.shared.db.models import Message, Turn, User
from signalbox.shared.statuses import TurnState
from tests.orchestrator.support import make_conversation, make_turn


def _queued(
    sessions: sessionmaker[Session], user_id: str, text: str, seq: int, conversation_id: str
) -> store.TurnInfo:
    info = store.load_turn(sessions, make_turn(sessions, conversation_id, user_id, text, seq=seq))
    assert info is not None
    return info


def test_a_queued_turn_starts_once_with_its_text_as_the_next_message(
    db_sessions: sessionmaker[Session], make_user: Callable[[], tuple[str, str]]
) -> None:
    user_id, _ = make_user()
    with db_sessions() as s, s.begin():
        s.execute(update(User).where(User.id == user_id).values(is_admin=True))
    conversation_id = make_conversation(db_sessions, user_id)
    first = _queued(db_sessions, user_id, "first", 1, conversation_id)
    store.open_turn(db_sessions, first, "m")
    second = _queued(db_sessions, user_id, "second", 2, conversation_id)

    opened = store.open_turn(db_sessions, second, "the-model", timeout_s=60)
    again = store.open_turn(db_sessions, second, "the-model", timeout_s=60)

    assert opened.started and opened.status == TurnState.QUEUED and opened.admin
    assert opened.queued_s is not None and opened.queued_s >= 0
    assert not again.started and again.status == TurnState.RUNNING
    assert again.deadline_at == opened.deadline_at
    with db_sessions() as s:
        turn = s.get(Turn, second.turn_id)
        assert turn is not None
        assert (turn.status, turn.model) == (TurnState.RUNNING, "the-model")
        assert turn.started_at is not None and turn.deadline_at is not None
        assert abs((turn.deadline_at - turn.started_at).total_seconds() - 60) < 1e-3
        messages = s.execute(
            select(Message.turn_id, Message.seq, Message.role, Message.step, Message.content)
            .where(Message.conversation_id == conversation_id)
            .order_by(Message.seq)
        ).all()
    assert [tuple(m) for m in messages] == [
        (first.turn_id, 1, "user", 0, [{"type": "text", "text": "first"}]),
        (second.turn_id, 2, "user", 0, [{"type": "text", "text": "second"}]),
    ]


def test_a_cancelled_turn_is_found_not_started_and_a_missing_one_is_an_error(
    db_sessions: sessionmaker[Session], make_user: Callable[[], tuple[str, str]]
) -> None:
    user_id, _ = make_user()
    conversation_id = make_conversation(db_sessions, user_id)
    info = _queued(db_sessions, user_id, "never", 1, conversation_id)
    with db_sessions() as s, s.begin():
        s.execute(update(Turn).where(Turn.id == info.turn_id).values(cancel_requested=True))

    opened = store.open_turn(db_sessions, info, "m", timeout_s=5)

    assert not opened.started and opened.cancel_requested and not opened.admin
    assert (opened.status, opened.deadline_at) == (TurnState.QUEUED, None)
    with db_sessions() as s:
        assert s.scalar(select(Turn.status).where(Turn.id == info.turn_id)) == TurnState.QUEUED
        assert not s.scalars(select(Message).where(Message.turn_id == info.turn_id)).all()
    missing = dataclasses.replace(info, turn_id="turn_missing")
    with pytest.raises(LookupError):
        store.open_turn(db_sessions, missing, "m")
