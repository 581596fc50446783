"""The gateway's explicit revert and decided-listing routes, against the real proposals service."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from signalbox.shared.proposals_api import DECIDED_MAX_LIMIT
from tests import http_calls
from tests.gateway.conftest import LiveGateway, ServerThread, bearer

Users = Callable[[], tuple[str, str]]


def applied_proposal(
    gw: LiveGateway,
    proposals: ServerThread,
    internal_token: str,
    user_id: str,
    token: str,
    path: str,
) -> str:
    """A proposal of ``user_id`` creating ``path``, approved through the gateway."""
    with http_calls.Client(base_url=gw.url, headers=bearer(token)) as http:
        conversation_id = http.post("/api/conversations", json={}).json()["conversation_id"]
        created = http_calls.post(
            f"{proposals.url}/internal/proposals",
            headers={"X-Signalbox-Internal-Token": internal_token},
            json={
                "user_id": user_id,
                "conversation_id": conversation_id,
                "files": [{"path": path, "operation": "create", "after": "new\n"}],
            },
        )
        assert created.status_code == 201, created.text
        pid: str = created.json()["proposal_id"]
        assert http.post(f"/api/proposals/{pid}/approve").status_code == 200
    return pid


def test_revert_through_the_gateway_proposes_and_approving_it_restores_the_workspace(
    gw: LiveGateway,
    proposals: ServerThread,
    make_user: Users,
    internal_token: str,
    service_env: dict[str, str],
) -> None:
    user_id, token = make_user()
    pid = applied_proposal(gw, proposals, internal_token, user_id, token, "made.txt")
    made = Path(service_env["SIGNALBOX_WORKSPACES_ROOT"]).resolve() / user_id / "default/made.txt"
    assert made.exists()
    with http_calls.Client(base_url=gw.url, headers=bearer(token)) as http:
        reverted = http.post(f"/api/proposals/{pid}/revert", json={"scope": "turn"})
        assert reverted.status_code == 201, reverted.text
        back = reverted.json()
        assert back["reverts"] == [pid] and back["status"] == "pending"
        assert made.exists()  # proposed, not written
        assert http.post(f"/api/proposals/{back['proposal_id']}/approve").status_code == 200
        assert not made.exists()

        decided = http.get("/api/proposals/decided", params={"limit": 10})
        assert decided.status_code == 200, decided.text
        assert [(p["proposal_id"], p["status"]) for p in decided.json()["proposals"]] == [
            (back["proposal_id"], "applied"),
            (pid, "applied"),
        ]
        again = http.post(f"/api/proposals/{pid}/revert")
        assert again.status_code == 409 and "nothing to revert" in again.json()["detail"]


def test_the_gateway_refuses_a_bad_limit_or_scope_before_asking_the_service(
    gw: LiveGateway, proposals: ServerThread, make_user: Users
) -> None:
    _, token = make_user()
    with http_calls.Client(base_url=gw.url, headers=bearer(token)) as http:
        for limit in ("0", str(DECIDED_MAX_LIMIT + 1), "-1", "1e3", "5%00"):
            response = http.get(f"/api/proposals/decided?limit={limit}")
            assert response.status_code == 422, (limit, response.text)
        bad_scope = http.post("/api/proposals/prop_x/revert", json={"scope": "everything"})
        assert bad_scope.status_code == 422
        assert http.get("/api/proposals/decided").json() == {"proposals": []}


def test_another_users_applied_proposal_is_404_on_revert_and_absent_from_my_listing(
    gw: LiveGateway,
    proposals: ServerThread,
    make_user: Users,
    internal_token: str,
    service_env: dict[str, str],
) -> None:
    victim_id, victim_token = make_user()
    pid = applied_proposal(gw, proposals, internal_token, victim_id, victim_token, "v.txt")
    _, attacker = make_user()
    with http_calls.Client(base_url=gw.url, headers=bearer(attacker)) as http:
        for body in (None, {"scope": "proposal"}, {"scope": "turn"}):
            attack = http.post(f"/api/proposals/{pid}/revert", json=body)
            assert attack.status_code == 404, attack.text
            absent = http.post("/api/proposals/prop_absent/revert", json=body)
            assert attack.text.replace(pid, "prop_absent") == absent.text
        listed = http.get("/api/proposals/decided", params={"limit": DECIDED_MAX_LIMIT})
        assert listed.status_code == 200 and pid not in listed.text
    with http_calls.Client(base_url=gw.url, headers=bearer(victim_token)) as http:
        assert http.get("/api/proposals/pending").json()["proposals"] == []  # no revert made
    victim_file = Path(service_env["SIGNALBOX_WORKSPACES_ROOT"]).resolve() / victim_id / "default"
    assert (victim_file / "v.txt").read_text() == "new\n"
