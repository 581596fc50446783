"""schemathesis against the gateway's own OpenAPI, on a real server in front of the real
proposals service: whatever a signed-in user (or anyone) sends, never a 5xx."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy.orm import Session, sessionmaker

from signalbox.shared.db.webhooks import Webhook
from signalbox.shared.ids import new_id
from tests import http_calls
from tests.gateway.conftest import LiveGateway, ServerThread, add_call, bearer
from tests.openapi_fuzz import fuzz_every_operation

Users = Callable[[], tuple[str, str]]


# Every operation of the API gets its examples: about 80 s on an idle machine, past the
# suite's default 120 s limit when the machine's cores are busy with another suite.
@pytest.mark.timeout(600)
def test_no_input_makes_the_gateway_fail(
    gw: LiveGateway,
    proposals: ServerThread,
    make_user: Users,
    db_sessions: sessionmaker[Session],
    internal_token: str,
) -> None:
    user_id, token = make_user()
    _, other = make_user()
    with http_calls.Client(base_url=gw.url, headers=bearer(token)) as http:
        conversation_id = http.post("/api/conversations", json={}).json()["conversation_id"]
        turn = http.post(f"/api/conversations/{conversation_id}/turns", json={"text": "hi"})
        turn_id = turn.json()["turn_id"]
    call_id = add_call(db_sessions, turn_id, conversation_id)
    created = http_calls.post(
        f"{proposals.url}/internal/proposals",
        headers={"X-Signalbox-Internal-Token": internal_token},
        json={
            "user_id": user_id,
            "conversation_id": conversation_id,
            "files": [{"path": "a.txt", "operation": "create", "after": "A\n"}],
        },
    )
    assert created.status_code == 201, created.text
    webhook_id = new_id("wh")  # written in SQL: registering one resolves its host's name
    with db_sessions() as s, s.begin():
        s.add(
            Webhook(
                id=webhook_id, user_id=user_id, url="https://example.com/h", kinds=[], secret="x"
            )
        )
    checked = fuzz_every_operation(
        f"{gw.url}/openapi.json",
        credentials=[bearer(token), bearer(other), {}],
        known={
            "conversation_id": [conversation_id, "conv_nope"],
            "turn_id": [turn_id, "turn_nope"],
            "call_id": [call_id, "call_nope"],
            "proposal_id": [created.json()["proposal_id"], "prop_nope"],
            "webhook_id": [webhook_id, "wh_nope"],
        },
        # A live event stream of a real conversation never ends: generated ids only.
        skip_known=frozenset({"GET /api/conversations/{conversation_id}/stream"}),
    )
    for operation in (
        "POST /api/conversations/{conversation_id}/turns",
        "POST /api/proposals/{proposal_id}/approve",
        "DELETE /api/proposals/all",
        "GET /api/proposals/decided",
        "POST /api/proposals/{proposal_id}/revert",
        "POST /api/workspaces",
        "POST /api/webhooks",
        "DELETE /api/webhooks/{webhook_id}",
    ):
        assert operation in checked
