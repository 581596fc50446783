"""Rename and archive (DELETE) a conversation: hidden from lists, no new turns, history kept."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from signalbox.shared.db import Conversation
from tests import http_calls
from tests.gateway.conftest import LiveGateway, add_turn, bearer

Users = Callable[[], tuple[str, str]]


def test_archive_hides_refuses_new_turns_and_keeps_history(
    gateway: LiveGateway,
    make_user: Users,
    conversation_of: Callable[[str], str],
    db_sessions: sessionmaker[Session],
) -> None:
    user_id, token = make_user()
    kept, archived = conversation_of(user_id), conversation_of(user_id)
    add_turn(db_sessions, user_id, archived, "completed")
    base = f"{gateway.url}/api/conversations"

    gone = http_calls.delete(f"{base}/{archived}", headers=bearer(token))
    assert gone.status_code == 200 and gone.json()["archived_at"]
    again = http_calls.delete(f"{base}/{archived}", headers=bearer(token))
    assert again.json()["archived_at"] == gone.json()["archived_at"], "archiving twice is harmless"

    listed = [c["conversation_id"] for c in http_calls.get(base, headers=bearer(token)).json()]
    assert listed == [kept]
    activity = http_calls.get(f"{gateway.url}/api/activity", headers=bearer(token)).json()
    assert [a["conversation_id"] for a in activity["conversations"]] == [kept]
    refused = http_calls.post(
        f"{base}/{archived}/turns", headers=bearer(token), json={"text": "more"}
    )
    assert refused.status_code == 409 and "archived" in refused.json()["detail"]
    detail = http_calls.get(f"{base}/{archived}", headers=bearer(token))
    assert detail.status_code == 200 and len(detail.json()["turns"]) == 1, "history kept"
    with db_sessions() as session:
        row = session.get(Conversation, archived)
        assert row is not None and row.archived_at is not None


def test_rename_and_ownership(
    gateway: LiveGateway, make_user: Users, conversation_of: Callable[[str], str]
) -> None:
    user_id, token = make_user()
    _other_id, other_token = make_user()
    conversation_id = conversation_of(user_id)
    url = f"{gateway.url}/api/conversations/{conversation_id}"

    renamed = http_calls.patch(url, headers=bearer(token), json={"title": "  Release notes "})
    assert renamed.status_code == 200 and renamed.json()["title"] == "Release notes"
    listed = http_calls.get(f"{gateway.url}/api/conversations", headers=bearer(token)).json()
    assert listed[0]["title"] == "Release notes"
    assert http_calls.patch(url, headers=bearer(token), json={"title": ""}).status_code == 422
    assert (
        http_calls.patch(url, headers=bearer(other_token), json={"title": "x"}).status_code == 404
    )
    assert http_calls.delete(url, headers=bearer(other_token)).status_code == 404
