"""HTTP routes: health, auth, conversations, workspaces, the proposals routes, the UI."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from signalbox.redis_server import free_port
from tests import http_calls
from tests.gateway.conftest import LiveGateway, ServerThread, bearer, connect, request

Users = Callable[[], tuple[str, str]]


def test_healthz_and_readyz(gateway: LiveGateway) -> None:
    assert http_calls.get(f"{gateway.url}/healthz").json() == {"status": "ok"}
    ready = http_calls.get(f"{gateway.url}/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ok", "redis": "ok", "sql": "ok"}


def test_readyz_is_503_without_redis(start_gateway: Callable[..., LiveGateway]) -> None:
    gateway = start_gateway(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    ready = http_calls.get(f"{gateway.url}/readyz")
    assert ready.status_code == 503
    assert ready.json()["redis"] == "unavailable"
    assert ready.json()["sql"] == "ok"


def test_api_needs_a_valid_bearer_token(gateway: LiveGateway) -> None:
    assert http_calls.get(f"{gateway.url}/api/conversations").status_code == 401
    wrong = http_calls.get(f"{gateway.url}/api/conversations", headers=bearer("sbt_nope"))
    assert wrong.status_code == 401


def test_conversations_create_list_detail_events(gateway: LiveGateway, make_user: Users) -> None:
    _, token = make_user()
    _, other = make_user()
    with http_calls.Client(base_url=gateway.url, headers=bearer(token)) as http:
        created = http.post("/api/conversations", json={"title": "notes"})
        assert created.status_code == 201
        conversation_id = created.json()["conversation_id"]
        turn = http.post(f"/api/conversations/{conversation_id}/turns", json={"text": "hello"})
        assert turn.status_code == 202
        listed = http.get("/api/conversations").json()
        assert [c["conversation_id"] for c in listed] == [conversation_id]
        detail = http.get(f"/api/conversations/{conversation_id}").json()
        assert detail["title"] == "notes"
        assert [(t["turn_id"], t["status"]) for t in detail["turns"]] == [
            (turn.json()["turn_id"], "queued")
        ]
        assert detail["messages"] == detail["pending_decisions"] == detail["proposals"] == []
        events = http.get(f"/api/conversations/{conversation_id}/events").json()
        assert [e["kind"] for e in events] == ["conversation_created", "turn_queued"]
        after_first = http.get(
            f"/api/conversations/{conversation_id}/events", params={"after": events[0]["id"]}
        ).json()
        assert after_first == events[1:]
        bad = http.get(f"/api/conversations/{conversation_id}/events", params={"after": "x"})
        assert bad.status_code == 422
        cancel = http.post(f"/api/turns/{turn.json()['turn_id']}/cancel")
        assert cancel.json()["status"] == "queued"
    assert http_calls.get(f"{gateway.url}/api/conversations", headers=bearer(other)).json() == []
    foreign = http_calls.post(
        f"{gateway.url}/api/turns/{turn.json()['turn_id']}/cancel", headers=bearer(other)
    )
    assert foreign.status_code == 404


def test_workspaces_create_select_current(gateway: LiveGateway, make_user: Users) -> None:
    """Without the proposals service the workspaces still list, their git unknown."""
    user_id, token = make_user()
    with http_calls.Client(base_url=gateway.url, headers=bearer(token)) as http:
        assert http.get("/api/workspace/current").json() == {
            "name": "default",
            "selected": True,
            "path_exists": False,
            "git": None,
            "git_checked": False,
        }
        assert http.post("/api/workspaces", json={"name": "site"}).status_code == 201
        assert http.post("/api/workspaces", json={"name": "../up"}).status_code == 422
        assert http.post("/api/workspace/select", json={"name": "nope"}).status_code == 404
        assert http.post("/api/workspace/select", json={"name": "site"}).status_code == 200
        current = http.get("/api/workspace/current").json()
        assert (current["name"], current["path_exists"], current["git_checked"]) == (
            "site",
            True,
            False,
        )
        names = {w["name"]: w["selected"] for w in http.get("/api/workspaces").json()["workspaces"]}
        assert names == {"site": True, "default": False}
        conversation = http.post("/api/conversations", json={}).json()
        assert conversation["workspace"] == "site"
    assert (gateway.settings.workspaces_root / user_id / "site").is_dir()


def test_web_ui_is_served(gateway: LiveGateway) -> None:
    page = http_calls.get(f"{gateway.url}/")
    assert page.status_code == 200
    assert "Signalbox" in page.text
    assert http_calls.get(f"{gateway.url}/static/app.js").status_code == 200


# -- the proposals service, stood in for by a small app that records what it is sent --------


def _proposal(proposal_id: str, status: str) -> dict[str, Any]:
    return {
        "proposal_id": proposal_id,
        "conversation_id": "conv_1",
        "turn_id": None,
        "call_id": None,
        "workspace": "default",
        "summary": "stub",
        "created_at": "2026-01-01T00:00:00.000Z",
        "status": status,
        "version": 2,
        "decided_at": "2026-01-01T00:00:01.000Z",
        "decided_by": "user_1",
        "reason": None,
        "parent_id": None,
        "reverts": None,
        "files": [],
    }


@pytest.fixture
def proposals_stub() -> Iterator[tuple[ServerThread, list[dict[str, Any]]]]:
    seen: list[dict[str, Any]] = []

    async def any_route(request: Request) -> JSONResponse:
        body = await request.body()
        seen.append(
            {
                "method": request.method,
                "path": request.url.path,
                "query": request.url.query,
                "body": body.decode(),
                "internal": request.headers.get("x-signalbox-internal-token"),
                "user": request.headers.get("x-signalbox-user"),
            }
        )
        if request.url.path == "/api/proposals/pending":
            return JSONResponse({"proposals": []})
        if request.url.path == "/api/proposals/all":
            return JSONResponse({"rejected": ["p9"], "status": "rejected"})
        proposal_id = request.path_params.get("pid") or request.path_params.get("rest", "")
        if proposal_id == "stale":
            return JSONResponse({"detail": "file changed since it was proposed"}, 409)
        if proposal_id == "missing":
            return JSONResponse({"detail": "not found"}, 404)
        if proposal_id == "odd":  # not a proposal's shape: the service is broken
            return JSONResponse({"proposal_id": proposal_id}, 200)
        status = "rejected" if request.url.path.endswith("/reject") else "applied"
        return JSONResponse(_proposal(proposal_id, status), 200)

    app = Starlette(
        routes=[
            Route("/api/proposals/{pid}/{action}", any_route, methods=["POST"]),
            Route("/api/proposals/{rest:path}", any_route, methods=["GET", "POST", "DELETE"]),
        ]
    )
    server = ServerThread(app)
    server.start()
    yield server, seen
    server.stop()


def test_proposals_routes_call_the_service_acting_for_the_user(
    start_gateway: Callable[..., LiveGateway],
    make_user: Users,
    internal_token: str,
    proposals_stub: tuple[ServerThread, list[dict[str, Any]]],
) -> None:
    stub, seen = proposals_stub
    gateway = start_gateway(proposals_url=stub.url)
    user_id, token = make_user()
    with http_calls.Client(base_url=gateway.url, headers=bearer(token)) as http:
        pending = http.get("/api/proposals/pending", params={"limit": "5"})
        rejected = http.post("/api/proposals/p1/reject", json={"reason": "no"})
        partial = http.post("/api/proposals/p2/approve", json={"files": ["a.txt"]})
        stale = http.post("/api/proposals/stale/approve")
        missing = http.get("/api/proposals/missing")
        everything = http.request("DELETE", "/api/proposals/all")
        odd = http.get("/api/proposals/odd")
        assert http.get("/api/proposals/pending", headers=bearer("x")).status_code == 401
    assert pending.json() == {"proposals": []}
    assert rejected.json() == _proposal("p1", "rejected")
    assert partial.json() == _proposal("p2", "applied")
    assert stale.status_code == 409
    assert stale.json() == {"detail": "file changed since it was proposed"}
    assert (missing.status_code, missing.json()) == (404, {"detail": "not found"})
    assert everything.json() == {"rejected": ["p9"], "status": "rejected"}
    assert (odd.status_code, odd.json()["code"]) == (503, "unavailable")
    # Only the paths the routes build, never the client's query string or text.
    assert [(s["method"], s["path"], s["query"]) for s in seen] == [
        ("GET", "/api/proposals/pending", ""),
        ("POST", "/api/proposals/p1/reject", ""),
        ("POST", "/api/proposals/p2/approve", ""),
        ("POST", "/api/proposals/stale/approve", ""),
        ("GET", "/api/proposals/missing", ""),
        ("DELETE", "/api/proposals/all", ""),
        ("GET", "/api/proposals/odd", ""),
    ]
    assert json.loads(seen[1]["body"]) == {"reason": "no"}
    assert json.loads(seen[2]["body"]) == {"files": ["a.txt"]}
    assert all(s["internal"] == internal_token and s["user"] == user_id for s in seen)


@pytest.mark.anyio
async def test_decide_proposal_frame(
    start_gateway: Callable[..., LiveGateway],
    make_user: Users,
    proposals_stub: tuple[ServerThread, list[dict[str, Any]]],
) -> None:
    stub, seen = proposals_stub
    gateway = start_gateway(proposals_url=stub.url)
    user_id, token = make_user()

    async def decide(proposal_id: str, decision: str) -> dict[str, Any]:
        frame = {"type": "decide_proposal", "proposal_id": proposal_id, "decision": decision}
        reply = await request(ws, frame)
        reply.pop("req")
        return reply

    async with await connect(gateway, token) as ws:
        assert await decide("p7", "approve") == {
            "type": "ack", "proposal_id": "p7", "status": "applied"
        }  # fmt: skip
        assert (await decide("p8", "reject"))["status"] == "rejected"
        stale = await decide("stale", "approve")
        assert (stale["type"], stale["code"]) == ("error", "conflict")
        assert "file changed" in stale["message"]
        missing = await decide("missing", "reject")
        assert (missing["type"], missing["code"]) == ("error", "not_found")
    assert [s["path"] for s in seen] == [
        "/api/proposals/p7/approve",
        "/api/proposals/p8/reject",
        "/api/proposals/stale/approve",
        "/api/proposals/missing/reject",
    ]
    assert all(s["user"] == user_id for s in seen)


@pytest.mark.anyio
async def test_decide_proposal_without_the_service_is_unavailable(
    gateway: LiveGateway, make_user: Users
) -> None:
    _, token = make_user()
    async with await connect(gateway, token) as ws:
        frame = {"type": "decide_proposal", "proposal_id": "p1", "decision": "approve"}
        reply = await request(ws, frame)
    assert (reply["type"], reply["code"]) == ("error", "unavailable")
