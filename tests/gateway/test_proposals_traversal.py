"""User B attacks user A through the gateway's ``/api/proposals`` routes, as issue 12 found.

The gateway calls the proposals service with the deployment's internal token, so any path
text of B's that reaches the upstream URL could climb to ``/internal/...`` and act as
anyone. Each attack goes out byte for byte on a real socket; the proposals service behind
the real gateway records every path it is asked for, so "never reached" is seen, not
inferred.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from starlette.types import ASGIApp, Receive, Scope, Send

from signalbox.services.proposals.app import create_app as create_proposals_app
from signalbox.shared.db import Proposal
from tests import http_calls, rawhttp
from tests.gateway.conftest import LiveGateway, ServerThread, bearer, connect, request

Users = Callable[[], tuple[str, str]]

pytestmark = pytest.mark.anyio

# Every spelling of "../../internal/proposals" the issue tried, and the ones next to them.
TRAVERSALS = [
    "..%2F..%2Finternal%2Fproposals",
    "..%2f..%2finternal%2fproposals",
    "%2E%2E/%2E%2E/internal/proposals",
    "%2E%2E%2F%2E%2E%2Finternal%2Fproposals",
    "%2e%2E%2f%2E%2e%2FInternal%2Fproposals",
    "..%252F..%252Finternal%252Fproposals",
    "%252E%252E%252F%252E%252E%252Finternal%252Fproposals",
    "..%5C..%5Cinternal%5Cproposals",
    "..%5c..%5cinternal%5cproposals",
    "..\\..\\internal\\proposals",
    "x%2F..%2F..%2F..%2Finternal%2Fproposals",
    ".%2E/.%2E/internal/proposals",
]
# What may follow the traversal so it lands on each public route's shape.
SUFFIXES = ["", "%3F/approve", "%23/reject", "%3Fx=/approve", "/approve", "/reject"]


class RecordingApp:
    """The real proposals app, noting the method and path of every request it is sent."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.seen: list[tuple[str, str]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.seen.append((scope["method"], scope["path"]))
        await self.app(scope, receive, send)


@dataclass
class Scene:
    """A gateway in front of a recorded proposals service, and two users."""

    gateway: LiveGateway
    upstream: RecordingApp
    a_user: str
    a_token: str
    a_conversation: str
    b_token: str


@pytest.fixture
def scene(
    start_gateway: Callable[..., LiveGateway],
    service_env: dict[str, str],
    make_user: Users,
) -> Iterator[Scene]:
    upstream = RecordingApp(create_proposals_app())
    server = ServerThread(upstream)
    server.start()
    gateway = start_gateway(
        proposals_url=server.url,
        workspaces_root=Path(service_env["SIGNALBOX_WORKSPACES_ROOT"]),
    )
    a_user, a_token = make_user()
    _, b_token = make_user()
    created = http_calls.post(f"{gateway.url}/api/conversations", json={}, headers=bearer(a_token))
    assert created.status_code == 201, created.text
    yield Scene(gateway, upstream, a_user, a_token, created.json()["conversation_id"], b_token)
    server.stop()


def _forged(scene: Scene) -> bytes:
    """What B wants ``POST /internal/proposals`` to read: a proposal in A's conversation."""
    return json.dumps(
        {
            "user_id": scene.a_user,
            "conversation_id": scene.a_conversation,
            "workspace": "default",
            "summary": "forged by bob",
            "files": [{"path": "forged.txt", "operation": "create", "after": "bob\n"}],
        }
    ).encode()


def _assert_a_untouched(scene: Scene, db: sessionmaker[Session]) -> None:
    with db() as session:
        planted = session.scalars(
            select(Proposal.id).where(Proposal.conversation_id == scene.a_conversation)
        ).all()
    assert planted == []
    with http_calls.Client(base_url=scene.gateway.url, headers=bearer(scene.a_token)) as a:
        assert a.get("/api/proposals/pending").json() == {"proposals": []}
        # The service relays its outbox before it answers: a planted proposal's event is
        # already on A's stream by now.
        events = a.get(f"/api/conversations/{scene.a_conversation}/events").json()
    assert "proposal_created" not in [e["kind"] for e in events]


def test_encoded_traversal_never_reaches_the_internal_routes(
    scene: Scene, db_sessions: sessionmaker[Session]
) -> None:
    headers = {**bearer(scene.b_token), "Content-Type": "application/json"}
    answers: dict[str, int] = {}
    for traversal in TRAVERSALS:
        for suffix in SUFFIXES:
            target = f"/api/proposals/{traversal}{suffix}"
            for method in ("POST", "GET", "DELETE"):
                body = _forged(scene) if method == "POST" else None
                response = rawhttp.send(scene.gateway.url, method, target, headers, body)
                answers[f"{method} {target}"] = response.status
            status_target = (
                f"/api/proposals/{traversal.replace('proposals', 'workspaces')}"
                f"%2F{scene.a_user}%2Fdefault{suffix}"
            )
            response = rawhttp.send(scene.gateway.url, "GET", status_target, headers)
            answers[f"GET {status_target}"] = response.status
    assert {k: v for k, v in answers.items() if not 400 <= v < 500} == {}
    assert [seen for seen in scene.upstream.seen if "internal" in seen[1].lower()] == []
    _assert_a_untouched(scene, db_sessions)


def _a_proposal(scene: Scene, internal_token: str, proposals_url: str) -> str:
    created = http_calls.post(
        f"{proposals_url}/internal/proposals",
        headers={"X-Signalbox-Internal-Token": internal_token, "Content-Type": "application/json"},
        content=_forged(scene).replace(b"forged by bob", b"A's own change"),
    )
    assert created.status_code == 201, created.text
    proposal_id: str = created.json()["proposal_id"]
    return proposal_id


def test_b_cannot_read_or_decide_a_proposal_of_a_through_any_route(
    scene: Scene, internal_token: str
) -> None:
    proposals_url = scene.gateway.settings.proposals_url
    proposal_id = _a_proposal(scene, internal_token, proposals_url)
    attempts: list[tuple[str, str, dict[str, Any] | None]] = [
        ("GET", f"/api/proposals/{proposal_id}", None),
        ("POST", f"/api/proposals/{proposal_id}/approve", None),
        ("POST", f"/api/proposals/{proposal_id}/approve", {"files": ["forged.txt"]}),
        ("POST", f"/api/proposals/{proposal_id}/reject", {"reason": "mine now"}),
        ("POST", f"/api/proposals/{proposal_id}/reject", None),
    ]
    with http_calls.Client(base_url=scene.gateway.url, headers=bearer(scene.b_token)) as b:
        for method, path, body in attempts:
            response = b.request(method, path, json=body)
            assert response.status_code == 404, (method, path, response.text)
        everything = b.request("DELETE", "/api/proposals/all", json={"reason": "all mine"})
        assert everything.json() == {"rejected": [], "status": "rejected"}
        assert b.get("/api/proposals/pending").json() == {"proposals": []}
    with http_calls.Client(base_url=scene.gateway.url, headers=bearer(scene.a_token)) as a:
        mine = a.get(f"/api/proposals/{proposal_id}").json()
    assert (mine["status"], mine["version"], mine["decided_by"]) == ("pending", 1, None)


async def test_a_decide_proposal_frame_cannot_climb_to_the_internal_routes(
    scene: Scene, db_sessions: sessionmaker[Session]
) -> None:
    climbs = [
        "../../internal/proposals",
        f"../../internal/workspaces/{scene.a_user}/default?",
        "..%2F..%2Finternal%2Fproposals",
        "..\\..\\internal\\proposals",
        "%2E%2E/%2E%2E/internal/proposals#",
        "a\x00b",
        "x" * 5000,
    ]
    async with await connect(scene.gateway, scene.b_token) as ws:
        for proposal_id in climbs:
            for decision in ("approve", "reject"):
                frame = {
                    "type": "decide_proposal",
                    "proposal_id": proposal_id,
                    "decision": decision,
                }
                reply = await request(ws, frame)
                assert (reply["type"], reply.get("code")) in {
                    ("error", "not_found"),
                    ("error", "bad_frame"),
                }, (proposal_id, reply)
    assert [seen for seen in scene.upstream.seen if "internal" in seen[1].lower()] == []
    _assert_a_untouched(scene, db_sessions)
