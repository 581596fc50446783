"""Reverting applied proposals (a new pending proposal, never a write) and listing decided ones."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

from sqlalchemy.orm import Session, sessionmaker
from starlette.testclient import TestClient

from signalbox.services.proposals.context import ServiceContext
from signalbox.shared.db import Proposal
from signalbox.shared.proposals_api import DECIDED_MAX_LIMIT
from tests.proposals.conftest import Owner, Propose, events_of


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def applied(client: TestClient, owner: Owner, propose: Propose, files: list[dict[str, Any]]) -> str:
    created = propose(owner, files, summary="change " + files[0]["path"])
    assert created.status_code == 201, created.text
    pid: str = created.json()["proposal_id"]
    approved = client.post(f"/api/proposals/{pid}/approve", headers=owner.auth)
    assert approved.status_code == 200, approved.text
    return pid


def revert(client: TestClient, owner: Owner, pid: str, scope: str | None = None) -> Any:
    body = None if scope is None else {"scope": scope}
    return client.post(f"/api/proposals/{pid}/revert", headers=owner.auth, json=body)


def test_a_revert_is_a_pending_proposal_back_to_before_and_writes_nothing_until_approved(
    client: TestClient, ctx: ServiceContext, owner: Owner, propose: Propose
) -> None:
    (owner.workspace / "a.txt").write_text("a1\n")
    (owner.workspace / "c.txt").write_text("c1\n")
    pid = applied(
        client,
        owner,
        propose,
        [
            {"path": "a.txt", "operation": "update", "after": "a2\n"},
            {"path": "b.txt", "operation": "create", "after": "b\n"},
            {"path": "c.txt", "operation": "delete"},
        ],
    )
    response = revert(client, owner, pid)
    assert response.status_code == 201, response.text
    back = response.json()
    assert back["status"] == "pending" and back["reverts"] == [pid]
    assert back["conversation_id"] == owner.conversation_id and back["workspace"] == "default"
    assert back["turn_id"] is None  # the user proposes it, not a turn
    files = {f["path"]: f for f in back["files"]}
    assert {p: f["operation"] for p, f in files.items()} == {
        "a.txt": "update",
        "b.txt": "delete",
        "c.txt": "create",
    }
    assert files["a.txt"]["before_sha256"] == sha("a2\n")  # what is there now
    assert files["a.txt"]["after"] == "a1\n"
    assert files["b.txt"]["before_sha256"] == sha("b\n")
    assert files["c.txt"]["after"] == "c1\n"
    # Nothing written yet.
    assert (owner.workspace / "a.txt").read_text() == "a2\n"
    assert (owner.workspace / "b.txt").exists()

    created = events_of(ctx, owner, "proposal_created")
    assert created[-1]["proposal_id"] == back["proposal_id"]
    assert created[-1]["reverts"] == [pid]
    assert created[0]["reverts"] is None  # an ordinary proposal reverts nothing

    # Asking again while it is pending gives the same revert, not a second one.
    again = revert(client, owner, pid)
    assert again.status_code == 201 and again.json()["proposal_id"] == back["proposal_id"]

    approved = client.post(f"/api/proposals/{back['proposal_id']}/approve", headers=owner.auth)
    assert approved.status_code == 200, approved.text
    assert (owner.workspace / "a.txt").read_text() == "a1\n"
    assert not (owner.workspace / "b.txt").exists()
    assert (owner.workspace / "c.txt").read_text() == "c1\n"

    # Everything is as before: nothing left to revert.
    nothing = revert(client, owner, pid)
    assert nothing.status_code == 409
    assert "nothing to revert" in nothing.json()["detail"]


def test_approving_a_revert_after_the_file_changed_again_is_a_conflict(
    client: TestClient, owner: Owner, propose: Propose
) -> None:
    pid = applied(
        client, owner, propose, [{"path": "n.txt", "operation": "create", "after": "1\n"}]
    )
    back = revert(client, owner, pid).json()
    (owner.workspace / "n.txt").write_text("edited by hand\n")
    approved = client.post(f"/api/proposals/{back['proposal_id']}/approve", headers=owner.auth)
    assert approved.status_code == 409, approved.text
    assert approved.json()["status"] == "conflict"
    assert (owner.workspace / "n.txt").read_text() == "edited by hand\n"


def test_only_an_applied_proposal_can_be_reverted(
    client: TestClient, owner: Owner, propose: Propose
) -> None:
    created = propose(owner, [{"path": "p.txt", "operation": "create", "after": "p\n"}])
    pid = created.json()["proposal_id"]
    pending = revert(client, owner, pid)
    assert pending.status_code == 409
    assert pending.json()["status"] == "pending"
    client.post(f"/api/proposals/{pid}/reject", headers=owner.auth, json={"reason": "no"})
    rejected = revert(client, owner, pid)
    assert rejected.status_code == 409 and rejected.json()["status"] == "rejected"
    assert not (owner.workspace / "p.txt").exists()


def test_a_turn_revert_undoes_all_its_applied_proposals_of_one_file_in_one_proposal(
    client: TestClient,
    owner: Owner,
    propose: Propose,
    internal_token: str,
    db_sessions: sessionmaker[Session],
) -> None:
    def in_turn(turn_id: str, files: list[dict[str, Any]]) -> str:
        created = client.post(
            "/internal/proposals",
            headers={"X-Signalbox-Internal-Token": internal_token},
            json={
                "user_id": owner.user_id,
                "conversation_id": owner.conversation_id,
                "turn_id": turn_id,
                "call_id": f"call_{uuid.uuid4().hex[:12]}",
                "files": files,
            },
        )
        assert created.status_code == 201, created.text
        pid: str = created.json()["proposal_id"]
        assert client.post(f"/api/proposals/{pid}/approve", headers=owner.auth).status_code == 200
        return pid

    (owner.workspace / "keep.txt").write_text("kept\n")
    first = in_turn("turn_one", [{"path": "f.txt", "operation": "create", "after": "v1\n"}])
    second = in_turn("turn_one", [{"path": "f.txt", "operation": "update", "after": "v2\n"}])
    other = in_turn("turn_two", [{"path": "keep.txt", "operation": "update", "after": "k2\n"}])

    response = revert(client, owner, second, scope="turn")
    assert response.status_code == 201, response.text
    back = response.json()
    assert back["reverts"] == [first, second]  # in the order they were applied
    assert [(f["path"], f["operation"]) for f in back["files"]] == [("f.txt", "delete")]
    approved = client.post(f"/api/proposals/{back['proposal_id']}/approve", headers=owner.auth)
    assert approved.status_code == 200, approved.text
    assert not (owner.workspace / "f.txt").exists()
    assert (owner.workspace / "keep.txt").read_text() == "k2\n"  # another turn's: untouched
    with db_sessions() as session:
        untouched = session.get(Proposal, other)
        assert untouched is not None and untouched.status == "applied"


def test_decided_lists_mine_newest_first_with_their_outcome_and_a_bounded_count(
    client: TestClient, owner: Owner, make_owner: Any, propose: Propose
) -> None:
    stranger = make_owner()
    theirs = applied(
        client, stranger, propose, [{"path": "x", "operation": "create", "after": "x"}]
    )
    mine_applied = applied(
        client, owner, propose, [{"path": "a", "operation": "create", "after": ""}]
    )
    rejected = propose(owner, [{"path": "b", "operation": "create", "after": "b"}]).json()
    client.post(f"/api/proposals/{rejected['proposal_id']}/reject", headers=owner.auth, json={})
    waiting = propose(owner, [{"path": "c", "operation": "create", "after": "c"}]).json()

    listed = client.get("/api/proposals/decided", headers=owner.auth)
    assert listed.status_code == 200, listed.text
    rows = listed.json()["proposals"]
    assert [(p["proposal_id"], p["status"]) for p in rows] == [
        (rejected["proposal_id"], "rejected"),
        (mine_applied, "applied"),
    ]
    assert waiting["proposal_id"] not in listed.text and theirs not in listed.text

    one = client.get("/api/proposals/decided", headers=owner.auth, params={"limit": 1})
    assert [p["proposal_id"] for p in one.json()["proposals"]] == [rejected["proposal_id"]]
    for bad in (0, DECIDED_MAX_LIMIT + 1, "x"):
        refused = client.get("/api/proposals/decided", headers=owner.auth, params={"limit": bad})
        assert refused.status_code == 422, bad


def test_another_users_proposal_is_404_on_revert_exactly_like_none(
    client: TestClient, owner: Owner, make_owner: Any, propose: Propose
) -> None:
    victim = make_owner()
    pid = applied(client, victim, propose, [{"path": "v.txt", "operation": "create", "after": "v"}])
    for scope in (None, "proposal", "turn"):
        attack = revert(client, owner, pid, scope)
        assert attack.status_code == 404, attack.text
        absent = revert(client, owner, "prop_absent", scope)
        assert attack.text.replace(pid, "prop_absent") == absent.text
    assert client.get("/api/proposals/pending", headers=victim.auth).json()["proposals"] == []
    assert client.get("/api/proposals/pending", headers=owner.auth).json()["proposals"] == []
    assert (victim.workspace / "v.txt").read_text() == "v"
