"""GET /api/conversations/{id}: what waits for the human, by kind, and sub-agents nested."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session, sessionmaker

from tests import http_calls
from tests.gateway.conftest import LiveGateway, add_call, add_turn, bearer

Users = Callable[[], tuple[str, str]]


def test_detail_lists_pending_decisions_questions_and_client_tools(
    gateway: LiveGateway,
    make_user: Users,
    conversation_of: Callable[[str], str],
    db_sessions: sessionmaker[Session],
) -> None:
    user_id, token = make_user()
    _, other_token = make_user()
    cid = conversation_of(user_id)
    turn = add_turn(db_sessions, user_id, cid, "parked")
    past = datetime.now(UTC) - timedelta(seconds=1)
    future = datetime.now(UTC) + timedelta(minutes=5)
    seq = iter(range(1, 100))

    def call(**fields: object) -> str:
        return add_call(db_sessions, turn, cid, seq=next(seq), **fields)

    decision = call(expires_at=future)
    call(expires_at=past)  # its time is over: nothing to decide
    call(expires_at=future, decision="allow")  # decided, the orchestrator has not run it yet
    question = call(
        tool="ask_user",
        executor="inline",
        status="waiting",
        input={"question": "Which file?", "options": ["a.txt", "b.txt"]},
        expires_at=future,
    )
    call(tool="ask_user", executor="inline", status="waiting",
         input={"question": "Too late?"}, expires_at=past)  # fmt: skip
    call(tool="ask_user", executor="inline", status="ok", input={"question": "Done?"})
    client_waiting = call(
        tool="editor_state",
        executor="client",
        status="waiting",
        input={"pane": 1},
        timeout_s=7.0,
        expires_at=future,
    )
    client_running = call(tool="editor_cursor", executor="client", status="running", input={})
    call(tool="read_file", executor="server", status="running", input={"path": "x"})
    call(tool="editor_state", executor="client", status="timeout", input={})

    with http_calls.Client(base_url=gateway.url, headers=bearer(token)) as http:
        detail = http.get(f"/api/conversations/{cid}").json()
    assert [d["call_id"] for d in detail["pending_decisions"]] == [decision]
    assert detail["pending_decisions"][0]["tool"] == "run_python"
    assert detail["pending_decisions"][0]["expires_at"].startswith(
        future.strftime("%Y-%m-%dT%H:%M")
    )
    assert detail["pending_questions"] == [
        {
            "question_id": question,
            "turn_id": turn,
            "text": "Which file?",
            "options": ["a.txt", "b.txt"],
            "expires_at": detail["pending_questions"][0]["expires_at"],
        }
    ]
    assert [(c["call_id"], c["tool"]) for c in detail["pending_client_tools"]] == [
        (client_waiting, "editor_state"),
        (client_running, "editor_cursor"),
    ]
    assert detail["pending_client_tools"][0]["input"] == {"pane": 1}
    assert detail["pending_client_tools"][0]["timeout_s"] == 7.0
    assert "token" not in str(detail["pending_client_tools"])  # the token went to sockets only
    foreign = http_calls.get(f"{gateway.url}/api/conversations/{cid}", headers=bearer(other_token))
    assert foreign.status_code == 404


def test_sub_agent_turns_are_nested_under_their_parent(
    gateway: LiveGateway,
    make_user: Users,
    conversation_of: Callable[[str], str],
    db_sessions: sessionmaker[Session],
) -> None:
    user_id, token = make_user()
    cid = conversation_of(user_id)
    parent = add_turn(db_sessions, user_id, cid, "running")
    spawn = add_call(
        db_sessions,
        parent,
        cid,
        seq=1,
        tool="spawn_agent",
        executor="inline",
        status="running",
        input={"task": "look around"},
    )
    child = add_turn(db_sessions, user_id, cid, "running", parent_call_id=spawn)
    add_call(db_sessions, child, cid, seq=2, tool="list_dir", status="ok", input={})
    orphan = add_turn(db_sessions, user_id, cid, "failed", parent_call_id="call_gone")

    with http_calls.Client(base_url=gateway.url, headers=bearer(token)) as http:
        detail = http.get(f"/api/conversations/{cid}").json()
    top = {t["turn_id"]: t for t in detail["turns"]}
    assert set(top) == {parent, orphan}  # the child is not a turn of the conversation's own
    assert top[parent]["parent_call_id"] is None
    assert [(s["turn_id"], s["parent_call_id"]) for s in top[parent]["sub_agents"]] == [
        (child, spawn)
    ]
    assert top[orphan]["parent_call_id"] == "call_gone"  # flagged, though its parent is gone
    by_turn = {m["turn_id"]: m["parent_call_id"] for m in detail["messages"]}
    assert by_turn == {parent: None, child: spawn}
    # The spawn_agent call itself runs on the server: nothing there waits for the human.
    assert detail["pending_decisions"] == detail["pending_client_tools"] == []
