"""``store.open_turn`` and ``store.finish_turn``: a queued turn starts once, with its user's
text as the next message of the conversation; a cancelled or started turn is reported as
found and left alone; a finished turn ends its sub-agents' turns that had not ended."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from signalbox.services.orchestrator import store
from signalbox.services.orchestrator.model import ToolUse
from signalbox.shared.db.models import Message, ToolCall, Turn, User
from signalbox.shared.statuses import TurnState
from tests.orchestrator.support import make_conversation, make_turn


def _queued(
    sessions: sessionmaker[Session], user_id: str, text: str, seq: int, conversation_id: str
) -> store.TurnInfo:
    info = store.load_turn(sessions, make_turn(sessions, conversation_id, user_id, text, seq=seq))
    assert info is not None
    return info


def _spawning(
    sessions: sessionmaker[Session],
    user_id: str,
    conversation_id: str,
    input_tokens: int,
    output_tokens: int,
) -> tuple[store.TurnInfo, ToolCall]:
    """A started turn whose first step (with this usage) made one spawn_agent call."""
    parent = _queued(sessions, user_id, "parent", 1, conversation_id)
    store.open_turn(sessions, parent, "m")
    use = ToolUse("toolu_spawn", "spawn_agent", {})
    planned = [store.PlannedCall(use, 5.0, "running")]
    _message, (call,) = store.store_step(sessions, parent, "", planned, input_tokens, output_tokens)
    return parent, call


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


def test_a_sub_agents_usage_goes_to_its_parent_once_and_an_ended_one_keeps_its_status(
    db_sessions: sessionmaker[Session], make_user: Callable[[], tuple[str, str]]
) -> None:
    """A child turn's usage is charged to its parent when it finishes, once; finishing the
    parent leaves its ended children as they ended."""
    user_id, _ = make_user()
    conversation_id = make_conversation(db_sessions, user_id)
    parent, call = _spawning(db_sessions, user_id, conversation_id, 11, 7)
    running, done = (make_turn(db_sessions, conversation_id, user_id, t, seq=0) for t in "ab")
    with db_sessions() as s, s.begin():
        s.execute(update(Turn).where(Turn.id.in_([running, done])).values(parent_call_id=call.id))
        s.execute(update(Turn).where(Turn.id == running).values(status=TurnState.RUNNING))
        s.execute(update(Turn).where(Turn.id == done).values(status=TurnState.COMPLETED))
        s.execute(update(Turn).where(Turn.id == running).values(input_tokens=5, output_tokens=3))

    child = store.finish_turn(db_sessions, running, TurnState.FAILED, "x", usage_to=parent.turn_id)
    finished = store.finish_turn(db_sessions, parent.turn_id, TurnState.COMPLETED, None)
    twice = store.finish_turn(db_sessions, running, TurnState.FAILED, "x", usage_to=parent.turn_id)

    assert child is not None and finished is not None and twice is None
    with db_sessions() as s:
        rows = {
            t.id: (t.status, t.error, t.input_tokens, t.output_tokens)
            for t in s.scalars(select(Turn).where(Turn.conversation_id == conversation_id))
        }
    assert rows[parent.turn_id] == (TurnState.COMPLETED, None, 11 + 5, 7 + 3)
    assert rows[running] == (TurnState.FAILED, "x", 5, 3)
    assert rows[done][:2] == (TurnState.COMPLETED, None)


def test_a_parent_that_ends_first_ends_its_running_sub_agent(
    db_sessions: sessionmaker[Session], make_user: Callable[[], tuple[str, str]]
) -> None:
    """A sub-agent's turn still running when its parent finishes (its runner died) ends
    with it, saying why."""
    user_id, _ = make_user()
    conversation_id = make_conversation(db_sessions, user_id)
    parent, call = _spawning(db_sessions, user_id, conversation_id, 1, 1)
    orphan = make_turn(db_sessions, conversation_id, user_id, "child", seq=0)
    with db_sessions() as s, s.begin():
        s.execute(
            update(Turn)
            .where(Turn.id == orphan)
            .values(parent_call_id=call.id, status=TurnState.RUNNING)
        )

    store.finish_turn(db_sessions, parent.turn_id, TurnState.CANCELLED, None)

    with db_sessions() as s:
        row = s.execute(select(Turn.status, Turn.error).where(Turn.id == orphan)).one()
    assert tuple(row) == (TurnState.CANCELLED, "its parent turn ended (cancelled)")
