"""user_turn / HTTP turns: SQL rows, events on the socket, the Celery task on the broker."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import anyio.to_thread
import pytest
import redis
from celery.backends.base import DisabledBackend
from sqlalchemy import event, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from signalbox.services.gateway.state import Gateway
from signalbox.services.gateway.turns import RESEND_AFTER_S
from signalbox.shared.admission import anyone_waiting
from signalbox.shared.celery_app import ORCHESTRATOR_QUEUE
from signalbox.shared.db import AdmissionLock, Conversation, ToolCall, Turn
from signalbox.shared.db.models import now
from signalbox.shared.statuses import TurnState
from signalbox.shared.workspace_paths import workspace_dir
from tests import http_calls
from tests.databases import on_postgres
from tests.gateway.conftest import (
    RECV_TIMEOUT_S,
    LiveGateway,
    add_call,
    add_turn,
    bearer,
    connect,
    events_until,
    queued_messages,
    queued_turn_tasks,
    recv,
    request,
)

pytestmark = pytest.mark.anyio

Users = Callable[[], tuple[str, str]]


def _kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["kind"] for e in events]


async def test_user_turn_creates_conversation_turn_events_and_task(
    gateway: LiveGateway,
    make_user: Users,
    db_sessions: sessionmaker[Session],
    redis_client: redis.Redis,
) -> None:
    user_id, token = make_user()
    text = "Please tidy up the README and explain what changed. " * 3
    tools = [{"name": "editor_state", "description": "d", "input_schema": {"type": "object"},
              "timeout_s": 5.0}]  # fmt: skip
    async with await connect(gateway, token) as ws:
        frame = {"type": "user_turn", "conversation_id": None, "text": text, "client_tools": tools}
        ack = await request(ws, frame)
        assert ack["type"] == "ack"
        conversation_id, turn_id = ack["conversation_id"], ack["turn_id"]
        events = await events_until(ws, lambda es: len(es) >= 2)
    assert _kinds(events) == ["conversation_created", "turn_queued"]
    assert all(e["conversation_id"] == conversation_id for e in events)
    assert events[1]["turn_id"] == turn_id
    assert events[1]["data"] == {"text": text, "client_turn_id": None}
    assert events[0]["data"] == {
        "workspace": "default",
        "title": text[:60],
        "agent": None,  # the deployment's default agent
        "agent_version": None,
    }

    with db_sessions() as session:
        conversation = session.get(Conversation, conversation_id)
        turn = session.get(Turn, turn_id)
    assert conversation is not None and conversation.user_id == user_id
    assert turn is not None
    assert (turn.status, turn.seq, turn.conversation_id) == ("queued", 1, conversation_id)
    assert turn.client_tools == tools
    assert workspace_dir(gateway.settings.workspaces_root, user_id, "default").is_dir()
    assert queued_turn_tasks(redis_client, gateway.keys) == [("orchestrator.run_turn", [turn_id])]


async def test_run_turn_is_sent_with_no_celery_result_kept(
    gateway: LiveGateway, make_user: Users, redis_client: redis.Redis
) -> None:
    # A turn's outcome is in SQL and on its event stream: Celery's copy, read by nobody,
    # cost the gateway a result backend per sending thread and a subscription per turn,
    # and the orchestrator a write and a publish.
    _user_id, token = make_user()
    async with await connect(gateway, token) as ws:
        ack = await request(ws, {"type": "user_turn", "conversation_id": None, "text": "hi"})
    sent = queued_messages(redis_client, gateway.keys, ORCHESTRATOR_QUEUE)
    [message] = [m for m in sent if ack["turn_id"] in m["headers"]["argsrepr"]]
    assert message["headers"]["ignore_result"] is True
    state: Gateway = gateway.app.state.gateway
    assert isinstance(state.celery.backend, DisabledBackend)


async def test_client_turn_id_makes_the_send_idempotent(
    gateway: LiveGateway,
    make_user: Users,
    db_sessions: sessionmaker[Session],
    redis_client: redis.Redis,
) -> None:
    _, token = make_user()
    first = {"type": "user_turn", "conversation_id": None, "text": "hi", "client_turn_id": "c1"}
    async with await connect(gateway, token) as ws:
        a = await request(ws, first)
        b = await request(ws, first)  # a resend of a first message: no second conversation
        assert (a["conversation_id"], a["turn_id"]) == (b["conversation_id"], b["turn_id"])
        again = {**first, "conversation_id": a["conversation_id"], "client_turn_id": "c2"}
        c = await request(ws, again)
        d = await request(ws, again)
        assert c["turn_id"] == d["turn_id"] != a["turn_id"]
    with db_sessions() as session:
        turns = session.scalars(
            select(Turn).where(Turn.conversation_id == a["conversation_id"]).order_by(Turn.seq)
        ).all()
    assert [(t.id, t.seq) for t in turns] == [(a["turn_id"], 1), (c["turn_id"], 2)]
    # One message, for the first turn: the second waits in SQL (not admitted) until the
    # first ends, holding no message and no worker thread.
    assert [t.admitted_at is not None for t in turns] == [True, False]
    tasks = queued_turn_tasks(redis_client, gateway.keys)
    assert [args for _, args in tasks] == [[a["turn_id"]]]


async def test_a_first_turn_locks_its_user_and_reads_their_limits_once(
    gateway: LiveGateway, make_user: Users
) -> None:
    # The submission's checks (the resend check, the quota of conversations, the quota of
    # workspaces; the budget, then each quota) each asked for the user's row lock and their
    # limits: three UPDATEs and three SELECTs, one of each being enough for the transaction.
    user_id, token = make_user()
    engine = gateway.app.state.gateway.sessions.kw["bind"]
    sent: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if user_id in str(parameters):
            sent.append(" ".join(statement.split()))

    event.listen(engine, "before_cursor_execute", seen)
    try:
        async with await connect(gateway, token) as ws:
            frame = {"type": "user_turn", "conversation_id": None, "text": "hi",
                     "client_turn_id": "c1"}  # fmt: skip
            assert (await request(ws, frame))["type"] == "ack"
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    locks = [q for q in sent if q.startswith("UPDATE users SET id=")]
    # Read alone, or with the user's row (the admission pass's read of waiting users' limits,
    # ``IN (...)``, is not the checks'), once.
    mine = ("FROM user_limits WHERE user_limits.user_id = ", "LEFT OUTER JOIN user_limits")
    limits = [q for q in sent if any(form in q for form in mine)]
    assert len(locks) == 1, sent
    assert len(limits) == 1, sent
    assert any(q.startswith("INSERT INTO turns") for q in sent)  # the turn was stored


async def test_a_queued_turn_sent_again_later_is_sent_to_the_orchestrator_again(
    gateway: LiveGateway,
    make_user: Users,
    db_sessions: sessionmaker[Session],
    redis_client: redis.Redis,
) -> None:
    """Its first run_turn message was lost (Redis away after the insert: the client got
    `unavailable`); the client's resend sends it again instead of leaving it to the
    reconciler's sweep minutes later."""
    _, token = make_user()
    first = {"type": "user_turn", "conversation_id": None, "text": "hi", "client_turn_id": "r1"}
    async with await connect(gateway, token) as ws:
        a = await request(ws, first)
        redis_client.delete(f"{gateway.keys.prefix}{ORCHESTRATOR_QUEUE}")  # the message lost
        with db_sessions() as session, session.begin():
            turn = session.get(Turn, a["turn_id"])
            assert turn is not None and turn.admitted_at is not None
            turn.admitted_at = turn.admitted_at - timedelta(seconds=RESEND_AFTER_S + 1)
        b = await request(ws, first)
    assert b["turn_id"] == a["turn_id"]
    assert queued_turn_tasks(redis_client, gateway.keys) == [
        ("orchestrator.run_turn", [a["turn_id"]])
    ]


async def test_next_turn_on_a_new_socket_starts_at_its_turn_queued(
    gateway: LiveGateway, make_user: Users
) -> None:
    _, token = make_user()
    async with await connect(gateway, token) as ws:
        ack = await request(ws, {"type": "user_turn", "conversation_id": None, "text": "one"})
    async with await connect(gateway, token) as ws:
        frame = {"type": "user_turn", "conversation_id": ack["conversation_id"], "text": "two"}
        second = await request(ws, frame)
        events = await events_until(ws, lambda es: len(es) >= 1)
        assert _kinds(events) == ["turn_queued"]
        assert events[0]["turn_id"] == second["turn_id"]
        # Nothing older follows: the ping's reply is the next frame.
        await ws.send(json.dumps({"type": "ping", "req": "p"}))
        assert await recv(ws) == {"type": "pong", "req": "p"}


async def test_http_turn_is_queued_and_enqueued(
    gateway: LiveGateway, make_user: Users, redis_client: redis.Redis
) -> None:
    _, token = make_user()
    async with http_calls.AsyncClient(base_url=gateway.url, headers=bearer(token)) as http:
        conversation = (await http.post("/api/conversations", json={"title": "t"})).json()
        url = f"/api/conversations/{conversation['conversation_id']}/turns"
        response = await http.post(url, json={"text": "hello", "client_turn_id": "k"})
        repeat = await http.post(url, json={"text": "hello", "client_turn_id": "k"})
    assert response.status_code == 202
    assert repeat.json()["turn_id"] == response.json()["turn_id"]
    tasks = queued_turn_tasks(redis_client, gateway.keys)
    assert tasks == [("orchestrator.run_turn", [response.json()["turn_id"]])]


async def test_busy_policy_reject_refuses_a_second_turn(
    start_gateway: Callable[..., LiveGateway], make_user: Users
) -> None:
    gateway = start_gateway(busy_policy="reject")
    _, token = make_user()
    async with await connect(gateway, token) as ws:
        ack = await request(ws, {"type": "user_turn", "conversation_id": None, "text": "one"})
        frame = {"type": "user_turn", "conversation_id": ack["conversation_id"], "text": "two"}
        reply = await request(ws, frame)
    assert (reply["type"], reply["code"]) == ("error", "turn_busy")


async def test_cancel_marks_the_turn_and_publishes(
    gateway: LiveGateway,
    make_user: Users,
    db_sessions: sessionmaker[Session],
    redis_client: redis.Redis,
) -> None:
    _, token = make_user()
    _, other_token = make_user()
    pubsub = redis_client.pubsub()  # type: ignore[no-untyped-call]
    pubsub.subscribe(gateway.keys.control_channel)
    assert pubsub.get_message(timeout=30)["type"] == "subscribe"
    async with await connect(gateway, token) as ws:
        ack = await request(ws, {"type": "user_turn", "conversation_id": None, "text": "go"})
        reply = await request(ws, {"type": "cancel", "turn_id": ack["turn_id"]})
    assert reply["type"] == "ack"
    message = pubsub.get_message(timeout=30)
    assert message is not None
    assert json.loads(message["data"]) == {"type": "cancel", "turn_id": ack["turn_id"]}
    pubsub.close()
    with db_sessions() as session:
        turn = session.get(Turn, ack["turn_id"])
        assert turn is not None and turn.cancel_requested
    async with await connect(gateway, other_token) as ws:
        reply = await request(ws, {"type": "cancel", "turn_id": ack["turn_id"]})
    assert (reply["type"], reply["code"]) == ("error", "not_found")


async def test_decide_tool_records_once_announces_and_resumes(
    gateway: LiveGateway,
    make_user: Users,
    db_sessions: sessionmaker[Session],
    redis_client: redis.Redis,
) -> None:
    _, token = make_user()
    _, other_token = make_user()
    async with await connect(gateway, token) as ws:
        ack = await request(ws, {"type": "user_turn", "conversation_id": None, "text": "go"})
        await events_until(ws, lambda es: len(es) >= 2)
        call_id = add_call(db_sessions, ack["turn_id"], ack["conversation_id"])
        async with await connect(gateway, other_token) as intruder:
            reply = await request(intruder, {"type": "decide_tool", "call_id": call_id,
                                             "decision": "allow"})  # fmt: skip
            assert (reply["type"], reply["code"]) == ("error", "not_found")
        reply = await request(ws, {"type": "decide_tool", "call_id": call_id, "decision": "deny"})
        assert reply["type"] == "ack"
        events = await events_until(ws, lambda es: len(es) >= 1)
        assert events[0]["kind"] == "tool_call_decided"
        assert events[0]["data"] == {"call_id": call_id, "decision": "deny"}
        again = await request(ws, {"type": "decide_tool", "call_id": call_id, "decision": "allow"})
        assert (again["type"], again["code"]) == ("error", "conflict")
    with db_sessions() as session:
        call = session.get(ToolCall, call_id)
        assert call is not None and call.decision == "deny"
    tasks = queued_turn_tasks(redis_client, gateway.keys)
    assert [args for _, args in tasks] == [[ack["turn_id"]], [ack["turn_id"]]]


async def _a_backend_waits_for_a_lock(sessions: sessionmaker[Session]) -> None:
    """Return once a session of this database waits for a lock (PostgreSQL)."""
    query = text(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    deadline = time.monotonic() + RECV_TIMEOUT_S
    while True:
        with sessions() as session:
            if session.scalar(query):
                return
        assert time.monotonic() < deadline, "no session waited for a lock"
        await asyncio.sleep(0.01)  # another process's progress: polled, with a deadline


_ROW_LOCKS = pytest.mark.skipif(
    not on_postgres(), reason="row locks are PostgreSQL's: SQLite locks the whole database"
)


def _assert_admitted_and_sent(
    ack: dict[str, Any],
    sessions: sessionmaker[Session],
    client: redis.Redis,
    gateway: LiveGateway,
) -> None:
    """``ack`` acknowledges a turn that is admitted, and its ``run_turn`` was sent."""
    assert ack["type"] == "ack", ack
    with sessions() as session:
        turn = session.get(Turn, ack["turn_id"])
        assert turn is not None and turn.admitted_at is not None
    assert ("orchestrator.run_turn", [ack["turn_id"]]) in queued_turn_tasks(client, gateway.keys)


def _hold_admission_lock(session: Session) -> None:
    """Take the admission lock in ``session``'s transaction, as a pass does first."""
    session.execute(
        update(AdmissionLock).where(AdmissionLock.id == 1).values(passes=AdmissionLock.passes + 1)
    )


@_ROW_LOCKS
async def test_an_interrupting_turn_and_a_pass_admitting_the_turn_it_cancels_both_finish(
    start_gateway: Callable[..., LiveGateway],
    make_user: Users,
    db_sessions: sessionmaker[Session],
    conversation_of: Callable[[str], str],
) -> None:
    """An admission pass (an orchestrator's, a reconciler's) holds the admission lock and
    marks a waiting turn admitted, while a turn sent under ``interrupt`` cancels that turn:
    the submission runs no pass in the transaction that locks the turns it cancels, so it
    never waits for the pass's lock while holding a row the pass needs, and both finish. A
    pass in that transaction, waiting for the lock, deadlocked them (PostgreSQL aborts one:
    the user's turn refused ``internal``)."""
    gateway = start_gateway(busy_policy="interrupt")
    user_id, token = make_user()
    conversation_id = conversation_of(user_id)
    waiting = add_turn(
        db_sessions,
        user_id,
        conversation_id,
        TurnState.QUEUED,
        deployment=gateway.settings.redis_prefix,
    )
    async with await connect(gateway, token) as ws:
        with db_sessions() as a_pass:
            _hold_admission_lock(a_pass)
            frame = {"type": "user_turn", "conversation_id": conversation_id, "text": "second"}
            reply = asyncio.create_task(request(ws, frame))
            await _a_backend_waits_for_a_lock(db_sessions)
            a_pass.execute(update(Turn).where(Turn.id == waiting).values(admitted_at=now()))
            a_pass.commit()
        ack = await reply
    assert ack["type"] == "ack", ack
    with db_sessions() as session:
        first = session.get(Turn, waiting)
        assert first is not None and first.cancel_requested
        second = session.get(Turn, ack["turn_id"])
        assert second is not None and second.seq == 2


@_ROW_LOCKS
async def test_a_busy_admission_lock_does_not_hold_a_turns_insert(
    start_gateway: Callable[..., LiveGateway],
    make_user: Users,
    db_sessions: sessionmaker[Session],
    redis_client: redis.Redis,
) -> None:
    """On PostgreSQL the submission runs no pass inside its transaction: while a pass holds
    the admission lock, the turn is committed (its conversation's lock, and a first turn's
    user's, let go) and waits for the pass after the commit, which admits it once the lock
    frees. Waiting inside the transaction held those rows for as long as the pass ran, and a
    pass can wait on a row whose holder waits on them."""
    gateway = start_gateway()
    user_id, token = make_user()
    async with await connect(gateway, token) as ws:
        with db_sessions() as a_pass:
            _hold_admission_lock(a_pass)
            frame = {"type": "user_turn", "conversation_id": None, "text": "go"}
            reply = asyncio.create_task(request(ws, frame))
            deadline = time.monotonic() + RECV_TIMEOUT_S
            while True:  # the turn's insert commits while the lock is held
                with db_sessions() as session:
                    stored = session.scalar(select(Turn).where(Turn.user_id == user_id))
                if stored is not None:
                    break
                assert time.monotonic() < deadline, "the turn's insert waited for the lock"
                await asyncio.sleep(0.01)  # another process's progress: polled, with a deadline
            assert stored.admitted_at is None
            a_pass.commit()
        ack = await reply
    _assert_admitted_and_sent(ack, db_sessions, redis_client, gateway)


@pytest.mark.skipif(
    not on_postgres(),
    reason="SQLite's one write lock orders a freed slot and a submission: no window between",
)
async def test_a_turn_its_pass_left_waiting_gets_a_slot_freed_before_its_commit(
    start_gateway: Callable[..., LiveGateway],
    make_user: Users,
    db_sessions: sessionmaker[Session],
    conversation_of: Callable[[str], str],
    redis_client: redis.Redis,
) -> None:
    """A turn stored while its user's one slot is taken, and the slot freed between its
    insert and its commit by a runner that then finds no turn waiting (``anyone_waiting``
    cannot see the uncommitted turn, so that runner skips its pass): the gateway's pass
    after its commit gives it the slot, where a pass inside the transaction (before the
    slot freed) alone would have left it to the reconciler's sweep."""
    gateway = start_gateway(max_running_turns_per_user=1)
    prefix = gateway.settings.redis_prefix
    user_id, token = make_user()
    busy, idle = conversation_of(user_id), conversation_of(user_id)
    # It holds the user's one slot.
    running = add_turn(
        db_sessions, user_id, busy, TurnState.RUNNING, admitted_at=now(), deployment=prefix
    )
    state: Gateway = gateway.app.state.gateway
    paused, resume = threading.Event(), threading.Event()

    def inserting(conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.startswith("INSERT INTO turns"):
            conn.info["turn_inserted"] = True

    def rolled_back(conn: Any) -> None:  # an insert undone: not the submission's commit
        conn.info.pop("turn_inserted", None)

    def hold(session: Session) -> None:
        # The submission's commit: not a savepoint's release, nor another commit of the
        # gateway's (its webhook deliverer's).
        if session.in_nested_transaction():
            return
        if session.connection().info.pop("turn_inserted", False) and not paused.is_set():
            paused.set()
            assert resume.wait(RECV_TIMEOUT_S)

    async with await connect(gateway, token) as ws:
        event.listen(state.engine, "before_cursor_execute", inserting)
        event.listen(state.engine, "rollback", rolled_back)
        event.listen(state.sessions, "before_commit", hold)
        try:
            frame = {"type": "user_turn", "conversation_id": idle, "text": "next"}
            reply = asyncio.create_task(request(ws, frame))
            assert await anyio.to_thread.run_sync(paused.wait, RECV_TIMEOUT_S)
            with db_sessions() as session:  # the running turn ends; its runner looks
                session.execute(
                    update(Turn).where(Turn.id == running).values(status=TurnState.COMPLETED)
                )
                session.commit()
                assert not anyone_waiting(session, prefix)
            resume.set()
            ack = await reply
        finally:
            resume.set()
            event.remove(state.sessions, "before_commit", hold)
            event.remove(state.engine, "before_cursor_execute", inserting)
            event.remove(state.engine, "rollback", rolled_back)
    _assert_admitted_and_sent(ack, db_sessions, redis_client, gateway)
