"""The proposals service checks who owns what it is asked to act in; it does not trust the
caller. Even a holder of the internal token (a tool worker, or whoever stole its token)
cannot plant a proposal in a conversation that is not the named user's, nor in another
workspace than the conversation's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
import redis
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from signalbox.shared.db import Proposal
from signalbox.shared.event_stream import EventStream
from signalbox.shared.redis_keys import RedisKeys
from tests import http_calls
from tests.proposals.conftest import Owner, ServiceProcess, StartService


@pytest.fixture
def service(start_service: StartService) -> ServiceProcess:
    return start_service()


def _create(service: ServiceProcess, internal_token: str, **fields: Any) -> httpx.Response:
    body = {
        "summary": "planted",
        "files": [{"path": "planted.txt", "operation": "create", "after": "x\n"}],
        **fields,
    }
    return http_calls.post(
        service.url("/internal/proposals"),
        json=body,
        headers={"X-Signalbox-Internal-Token": internal_token},
    )


def test_an_internal_create_in_a_conversation_not_of_the_named_user_is_404(
    service: ServiceProcess,
    make_owner: Callable[[], Owner],
    internal_token: str,
    db_sessions: sessionmaker[Session],
    redis_client: redis.Redis,
    keys: RedisKeys,
) -> None:
    a, b = make_owner(), make_owner()
    attempts: list[dict[str, Any]] = [
        {"user_id": b.user_id, "conversation_id": a.conversation_id},
        {"user_id": b.user_id, "conversation_id": a.conversation_id, "workspace": "default"},
        {"user_id": a.user_id, "conversation_id": a.conversation_id, "workspace": "other"},
        {"user_id": a.user_id, "conversation_id": b.conversation_id},
        {"user_id": "user_nobody", "conversation_id": a.conversation_id},
        {"user_id": a.user_id, "conversation_id": "conv_nobody"},
    ]
    for fields in attempts:
        response = _create(service, internal_token, **fields)
        assert response.status_code == 404, (fields, response.text)
        # Word for word what a conversation that does not exist gets: nothing to probe.
        absent = _create(service, internal_token, **{**fields, "conversation_id": "conv_absent"})
        assert (
            response.json()["detail"].replace(fields["conversation_id"], "conv_absent")
            == (absent.json()["detail"])
        )
    with db_sessions() as session:
        planted = session.scalars(
            select(Proposal.id).where(
                Proposal.conversation_id.in_([a.conversation_id, b.conversation_id])
            )
        ).all()
    assert planted == []
    stream = EventStream(redis_client, keys)
    for who in (a, b):
        assert stream.read_after(who.conversation_id, None) == []
    assert not (a.workspace / "planted.txt").exists()
    assert not (a.workspace.parent / "other").exists()


def test_ids_that_are_no_ids_are_refused_before_any_lookup(
    service: ServiceProcess, owner: Owner, internal_token: str
) -> None:
    for field in ("user_id", "conversation_id", "turn_id", "call_id"):
        for bad in ("../x", "a\x00b", "a/b", "x" * 41, "", "conv_\u202e"):
            fields = {"user_id": owner.user_id, "conversation_id": owner.conversation_id}
            response = _create(service, internal_token, **{**fields, field: bad})
            assert response.status_code == 422, (field, bad, response.text)


def test_text_with_a_nul_byte_is_refused_not_stored(
    service: ServiceProcess, owner: Owner, internal_token: str
) -> None:
    # PostgreSQL cannot keep a NUL in a text column: refused up front, never a 500 at commit.
    ids = {"user_id": owner.user_id, "conversation_id": owner.conversation_id}
    for fields in (
        {"summary": "a\x00b"},
        {"files": [{"path": "n.txt", "operation": "create", "after": "a\x00b"}]},
        {"files": [{"path": "n\x00.txt", "operation": "create", "after": "ab"}]},
    ):
        response = _create(service, internal_token, **ids, **fields)
        assert response.status_code == 422, (fields, response.text)
    created = _create(service, internal_token, **ids).json()["proposal_id"]
    rejected = http_calls.post(
        service.url(f"/api/proposals/{created}/reject"),
        json={"reason": "no\x00pe"},
        headers=owner.auth,
    )
    assert rejected.status_code == 422, rejected.text
    partial = http_calls.post(
        service.url(f"/api/proposals/{created}/approve"),
        json={"files": ["planted\x00.txt"]},
        headers=owner.auth,
    )
    assert partial.status_code == 422, partial.text


def test_workspace_status_refuses_bad_names_and_unknown_users(
    service: ServiceProcess, owner: Owner, internal_token: str
) -> None:
    headers = {"X-Signalbox-Internal-Token": internal_token}

    def status(user_id: str, name: str) -> int:
        url = service.url(f"/internal/workspaces/{user_id}/{name}")
        return http_calls.get(url, headers=headers).status_code

    assert status(owner.user_id, "default") == 200
    assert status("user_nobody", "default") == 404
    for user_id, name in [
        ("..", "default"),
        ("%2E%2E", "default"),
        (owner.user_id, "%2E%2E"),
        (owner.user_id, ".hidden"),
        (owner.user_id, "a%00b"),
        ("a%00b", "default"),
        ("x" * 41, "default"),
        (owner.user_id, "x" * 101),
    ]:
        assert status(user_id, name) in (404, 422), (user_id, name)
