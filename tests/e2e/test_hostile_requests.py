"""The requests issue 12 sent to ``signalbox up``, against the real processes: each is
refused with a 4xx, never a 5xx or a dropped connection, and B's traversal plants nothing."""

from __future__ import annotations

import json
from collections.abc import Callable

from signalbox.stack import Stack
from tests import http_calls, rawhttp

Users = Callable[[], tuple[str, str]]


def test_the_issues_requests_are_refused_by_the_real_services(
    stack: Stack, make_stack_user: Users
) -> None:
    a_user, a_token = make_stack_user()
    _, b_token = make_stack_user()
    a = {"Authorization": f"Bearer {a_token}"}
    conversation = http_calls.post(f"{stack.gateway_url}/api/conversations", json={}, headers=a)
    conversation_id = conversation.json()["conversation_id"]
    forged = json.dumps(
        {
            "user_id": a_user,
            "conversation_id": conversation_id,
            "summary": "forged by bob",
            "files": [{"path": "forged.txt", "operation": "create", "after": "bob\n"}],
        }
    ).encode()
    b = {"Authorization": f"Bearer {b_token}", "Content-Type": "application/json"}
    requests = [
        ("GET", "/api/proposals/%00"),
        ("POST", "/api/proposals/%00/approve"),
        ("POST", "/api/proposals/%00/reject"),
        ("GET", "/api/proposals/%01%1F%7F"),
        ("POST", "/api/proposals/..%2F..%2Finternal%2Fproposals"),
        ("POST", "/api/proposals/%2E%2E/%2E%2E/internal/proposals"),
        ("POST", "/api/proposals/..%2f..%2finternal%2fproposals"),
        ("GET", f"/api/proposals/..%2F..%2Finternal%2Fworkspaces%2F{a_user}%2Fdefault"),
    ]
    for base, headers in ((stack.gateway_url, b), (stack.proposals_url, b)):
        for method, target in requests:
            body = forged if method == "POST" else None
            status = rawhttp.send(base, method, target, headers, body).status
            assert 400 <= status < 500, (base, method, target, status)
    pending = http_calls.get(f"{stack.gateway_url}/api/proposals/pending", headers=a)
    assert pending.json() == {"proposals": []}
    events = http_calls.get(
        f"{stack.gateway_url}/api/conversations/{conversation_id}/events", headers=a
    ).json()
    assert "proposal_created" not in [e["kind"] for e in events]
