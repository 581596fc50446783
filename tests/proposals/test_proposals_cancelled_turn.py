"""A proposal that arrives for a cancelled turn is refused: nothing a cancelled turn started
may wait for approval after it ended."""

from __future__ import annotations

import uuid

from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from signalbox.shared.db import Proposal
from signalbox.shared.db.models import Message, ToolCall, Turn
from signalbox.shared.ids import new_id

from .conftest import Owner

FILE = {"path": "late.txt", "operation": "create", "after": "x", "before_sha256": None}


def _turn(db: sessionmaker[Session], who: Owner, cancelled: bool, parent: str | None = None) -> str:
    turn_id = new_id("turn")
    with db() as s, s.begin():
        s.add(
            Turn(
                id=turn_id,
                conversation_id=who.conversation_id,
                user_id=who.user_id,
                seq=1,
                text="go",
                status="running",
                cancel_requested=cancelled,
                parent_call_id=parent,
            )
        )
    return turn_id


def _post(
    client: TestClient, token: str, who: Owner, turn_id: str
) -> tuple[int, dict[str, object]]:
    response = client.post(
        "/internal/proposals",
        headers={"X-Signalbox-Internal-Token": token},
        json={
            "user_id": who.user_id,
            "conversation_id": who.conversation_id,
            "turn_id": turn_id,
            "call_id": f"call_{uuid.uuid4().hex[:12]}",
            "workspace": "default",
            "summary": "create late.txt",
            "files": [FILE],
        },
    )
    return response.status_code, response.json()


def test_a_proposal_for_a_cancelled_turn_is_refused_and_nothing_is_stored(
    client: TestClient, internal_token: str, owner: Owner, db_sessions: sessionmaker[Session]
) -> None:
    turn_id = _turn(db_sessions, owner, cancelled=True)
    status, body = _post(client, internal_token, owner, turn_id)
    assert status == 409 and body["reason"] == "turn_cancelled", body
    with db_sessions() as s:
        assert list(s.scalars(select(Proposal).where(Proposal.turn_id == turn_id))) == []


def test_a_proposal_of_a_sub_agent_whose_parent_turn_was_cancelled_is_refused(
    client: TestClient, internal_token: str, owner: Owner, db_sessions: sessionmaker[Session]
) -> None:
    parent = _turn(db_sessions, owner, cancelled=True)
    call_id = new_id("call")
    with db_sessions() as s, s.begin():
        message_id = new_id("msg")
        s.add(
            Message(
                id=message_id,
                conversation_id=owner.conversation_id,
                turn_id=parent,
                seq=1,
                step=1,
                role="assistant",
                content=[],
            )
        )
        s.flush()
        s.add(
            ToolCall(
                id=call_id,
                turn_id=parent,
                message_id=message_id,
                position=0,
                tool_use_id="tu_1",
                tool="spawn_agent",
                input={},
                status="running",
            )
        )
    child = _turn(db_sessions, owner, cancelled=False, parent=call_id)
    status, body = _post(client, internal_token, owner, child)
    assert status == 409 and body["reason"] == "turn_cancelled", body


def test_a_proposal_for_a_live_turn_is_made(
    client: TestClient, internal_token: str, owner: Owner, db_sessions: sessionmaker[Session]
) -> None:
    turn_id = _turn(db_sessions, owner, cancelled=False)
    status, body = _post(client, internal_token, owner, turn_id)
    assert status == 201 and body["status"] == "pending", body
