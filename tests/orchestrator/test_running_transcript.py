"""The running transcript: read from SQL once, kept in memory, and always what SQL says."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from signalbox.services.orchestrator import compaction, store
from signalbox.services.orchestrator.model import ToolUse
from signalbox.services.orchestrator.running_transcript import RunningTranscript
from signalbox.services.orchestrator.transcript import load_messages
from signalbox.shared.db.models import Compaction, Message, ToolCall, Turn
from signalbox.shared.ids import new_id
from tests.orchestrator.support import make_conversation, make_turn


def _started(
    sessions: sessionmaker[Session], user_id: str, conversation_id: str, text: str, seq: int
) -> store.TurnInfo:
    turn_id = make_turn(sessions, conversation_id, user_id, text, seq=seq)
    info = store.load_turn(sessions, turn_id)
    assert info is not None
    store.open_turn(sessions, info, "test-model")
    return info


def _step(
    sessions: sessionmaker[Session], info: store.TurnInfo, *tools: str
) -> tuple[Message, list[ToolCall]]:
    planned = [
        store.PlannedCall(ToolUse(f"toolu_{info.turn_id}_{n}", tool, {"n": n}), 5.0, "pending")
        for n, tool in enumerate(tools)
    ]
    return store.store_step(sessions, info, f"calling {len(tools)}", planned, 3, 2)


def _an_ended_turn(
    sessions: sessionmaker[Session], user_id: str, conversation_id: str, text: str
) -> store.TurnInfo:
    """A first turn of the conversation that read a file (its output: ``old output``) and
    completed."""
    first = _started(sessions, user_id, conversation_id, text, 1)
    _msg, [old] = _step(sessions, first, "read_file")
    store.record_results(sessions, [store.ResultRow(old.id, "ok", "old output", None, 1)])
    store.finish_turn(sessions, first.turn_id, "completed", None)
    return first


def test_the_kept_transcript_is_what_sql_says_after_each_step(
    db_sessions: sessionmaker[Session], make_user: Callable[[], tuple[str, str]]
) -> None:
    user_id, _ = make_user()
    conversation_id = make_conversation(db_sessions, user_id)
    _an_ended_turn(db_sessions, user_id, conversation_id, "earlier turn")
    info = _started(db_sessions, user_id, conversation_id, "this turn", 2)
    kept = RunningTranscript(conversation_id)

    def truth() -> list[dict[str, object]]:
        with db_sessions() as s:
            return load_messages(s, conversation_id, notes={})

    def sent() -> list[dict[str, object]]:
        with store.standalone_connection(db_sessions) as conn:  # as model_step.request reads it
            return kept.sent(conn, {})

    assert sent() == truth()  # the first read is SQL's

    # A step this runner stores and ends itself: added in memory, ends as recorded.
    msg, calls = _step(db_sessions, info, "read_file", "ask_user")
    kept.stored(msg, calls)  # as model_step.take_step does with what store_step returns
    ours, theirs = calls
    assert sent() == truth()  # neither call has a result yet: no tool_use shown
    kept.ended(store.record_results(db_sessions, [store.ResultRow(ours.id, "ok", "ours", None, 1)]))
    # The other call ends elsewhere (a human's answer, the reconciler), not through it.
    with db_sessions() as s, s.begin():
        s.execute(
            update(ToolCall)
            .where(ToolCall.id == theirs.id)
            .values(status="timeout", error="nobody answered", output="")
        )
    after = sent()
    assert after == truth()
    results = [
        block
        for message in after
        if message["role"] == "user"
        for block in message["content"]  # type: ignore[attr-defined]
        if block.get("type") == "tool_result"
    ]
    assert [r["content"] for r in results] == [
        "old output",
        "ours",
        "the tool timed out after 5 s: nobody answered",
    ]

    # A new runner (a resumed turn) starts from SQL alone.
    with store.standalone_connection(db_sessions) as conn:
        assert RunningTranscript(conversation_id).sent(conn, {}) == truth()


def test_after_a_compaction_note_the_kept_transcript_is_the_note_and_what_follows_it(
    db_sessions: sessionmaker[Session], make_user: Callable[[], tuple[str, str]]
) -> None:
    user_id, _ = make_user()
    conversation_id = make_conversation(db_sessions, user_id)
    first = _an_ended_turn(db_sessions, user_id, conversation_id, "folded away")
    with db_sessions() as s:
        through = max(s.scalars(select(Message.seq).where(Message.turn_id == first.turn_id)))
    with db_sessions() as s, s.begin():
        s.add(
            Compaction(
                id=new_id("cmp"),
                conversation_id=conversation_id,
                turn_id=first.turn_id,
                through_seq=through,
                turns_folded=1,
                summary="the user asked to fold a file read",
                tokens_before=900,
                tokens_after=40,
            )
        )
    info = _started(db_sessions, user_id, conversation_id, "after the note", 2)
    _step(db_sessions, info, "read_file")

    with store.standalone_connection(db_sessions) as conn:
        kept = RunningTranscript(conversation_id).sent(conn, {})
    with db_sessions() as s:
        after = load_messages(s, conversation_id, notes={}, after_seq=through)
    assert kept == compaction.with_note(after, "the user asked to fold a file read")
    assert "old output" not in str(kept) and "after the note" in str(kept)


def test_a_child_turns_kept_transcript_is_its_own_messages_alone(
    db_sessions: sessionmaker[Session], make_user: Callable[[], tuple[str, str]]
) -> None:
    user_id, _ = make_user()
    conversation_id = make_conversation(db_sessions, user_id)
    parent = _started(db_sessions, user_id, conversation_id, "the parent's words", 1)
    _msg, [spawn] = _step(db_sessions, parent, "spawn_agent")
    child_id = make_turn(db_sessions, conversation_id, user_id, "the child's task", seq=0)
    with db_sessions() as s, s.begin():
        s.execute(update(Turn).where(Turn.id == child_id).values(parent_call_id=spawn.id))
    child = store.load_turn(db_sessions, child_id)
    assert child is not None
    store.open_turn(db_sessions, child, "test-model")
    _step(db_sessions, child, "read_file")

    with store.standalone_connection(db_sessions) as conn:
        kept = RunningTranscript(conversation_id, child_id).sent(conn, {})
        whole = RunningTranscript(conversation_id).sent(conn, {})
    with db_sessions() as s:
        assert kept == load_messages(s, conversation_id, child_turn_id=child_id, notes={})
        assert whole == load_messages(s, conversation_id, notes={})
    assert "the child's task" in str(kept) and "the parent's words" not in str(kept)
    assert "the child's task" not in str(whole)  # the conversation sees none of the child's
