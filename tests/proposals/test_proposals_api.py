"""The proposals routes end to end: create, list, read, approve, reject, expire, announce."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker
from starlette.testclient import TestClient

from signalbox.services.proposals.app import create_app
from signalbox.services.proposals.context import ServiceContext
from signalbox.shared.db import Outbox, Proposal
from tests.proposals.conftest import Approvals, Owner, Propose, events_of, resolved_rows


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_create_list_get_approve_writes_and_announces(
    client: TestClient,
    ctx: ServiceContext,
    owner: Owner,
    propose: Propose,
    approvals: Approvals,
) -> None:
    (owner.workspace / "a.txt").write_text("one\ntwo\n")
    (owner.workspace / "gone.txt").write_text("bye\n")
    created = propose(
        owner,
        [
            {"path": "a.txt", "operation": "update", "after": "one\nTWO\n",
             "before_sha256": sha("one\ntwo\n")},
            {"path": "new/dir/b.txt", "operation": "create", "after": "bee\n"},
            {"path": "gone.txt", "operation": "delete"},
        ],
        summary="three changes",
    )  # fmt: skip
    assert created.status_code == 201, created.text
    proposal = created.json()
    pid = proposal["proposal_id"]
    assert proposal["status"] == "pending"
    assert proposal["conversation_id"] == owner.conversation_id
    assert [f["operation"] for f in proposal["files"]] == ["update", "create", "delete"]
    assert proposal["files"][1]["before"] is None
    assert proposal["files"][2]["after"] is None
    assert events_of(ctx, owner, "proposal_created") == [
        {
            "turn_id": "turn_test",
            "proposal_id": pid,
            "summary": "three changes",
            "files": [
                {"path": "a.txt", "operation": "update"},
                {"path": "new/dir/b.txt", "operation": "create"},
                {"path": "gone.txt", "operation": "delete"},
            ],
            "parent_id": None,
            "reverts": None,
        }
    ]

    pending = client.get("/api/proposals/pending", headers=owner.auth)
    assert [p["proposal_id"] for p in pending.json()["proposals"]] == [pid]

    got = client.get(f"/api/proposals/{pid}", headers=owner.auth).json()
    update_file = got["files"][0]
    assert update_file["before"] == "one\ntwo\n"
    assert update_file["before_sha256"] == sha("one\ntwo\n")
    assert "-two\n+TWO\n" in update_file["diff"]
    assert got["files"][1]["diff"].startswith("--- /dev/null\n+++ b/new/dir/b.txt\n")
    assert "-bye\n" in got["files"][2]["diff"]

    approved = client.post(f"/api/proposals/{pid}/approve", headers=owner.auth)
    assert approved.status_code == 200, approved.text
    assert approved.json()["status"] == "applied"
    assert (owner.workspace / "a.txt").read_text() == "one\nTWO\n"
    assert (owner.workspace / "new/dir/b.txt").read_text() == "bee\n"
    assert not (owner.workspace / "gone.txt").exists()
    assert not [p for p in owner.workspace.rglob(".sb-apply-*")]

    resolved = events_of(ctx, owner, "proposal_resolved")
    assert resolved == [{"turn_id": "turn_test", "proposal_id": pid, "status": "applied"}]
    published = approvals.published_for(pid)
    assert published == [
        {
            "proposal_id": pid,
            "conversation_id": owner.conversation_id,
            "user_id": owner.user_id,
            "status": "applied",
            "version": 2,
            "turn_id": "turn_test",
        }
    ]
    assert client.get("/api/proposals/pending", headers=owner.auth).json() == {"proposals": []}


def test_approving_twice_writes_and_publishes_once(
    client: TestClient,
    ctx: ServiceContext,
    owner: Owner,
    propose: Propose,
    approvals: Approvals,
    db_sessions: sessionmaker[Session],
) -> None:
    pid = propose(owner, [{"path": "x.txt", "operation": "create", "after": "x"}]).json()[
        "proposal_id"
    ]
    first = client.post(f"/api/proposals/{pid}/approve", headers=owner.auth)
    (owner.workspace / "x.txt").write_text("edited by the human since")
    second = client.post(f"/api/proposals/{pid}/approve", headers=owner.auth, json={"files": []})
    assert (first.status_code, second.status_code) == (200, 200)
    assert second.json()["status"] == "applied"
    assert (owner.workspace / "x.txt").read_text() == "edited by the human since"
    assert len(resolved_rows(db_sessions, pid)) == 1
    assert len(events_of(ctx, owner, "proposal_resolved")) == 1
    assert len(approvals.published_for(pid)) == 1


def test_reject_then_approve_is_refused(
    client: TestClient, ctx: ServiceContext, owner: Owner, propose: Propose
) -> None:
    pid = propose(owner, [{"path": "r.txt", "operation": "create", "after": "r"}]).json()[
        "proposal_id"
    ]
    rejected = client.post(
        f"/api/proposals/{pid}/reject", headers=owner.auth, json={"reason": "no thanks"}
    )
    assert rejected.status_code == 200
    assert rejected.json()["status"] == "rejected"
    assert rejected.json()["reason"] == "no thanks"
    again = client.post(f"/api/proposals/{pid}/reject", headers=owner.auth)
    assert again.status_code == 200
    approve = client.post(f"/api/proposals/{pid}/approve", headers=owner.auth)
    assert approve.status_code == 409
    assert approve.json()["status"] == "rejected"
    assert not (owner.workspace / "r.txt").exists()
    assert events_of(ctx, owner, "proposal_resolved") == [
        {"turn_id": "turn_test", "proposal_id": pid, "status": "rejected"}
    ]


def test_reject_all_rejects_only_my_pending(
    client: TestClient,
    owner: Owner,
    make_owner: Callable[[], Owner],
    propose: Propose,
) -> None:
    other = make_owner()
    mine = [
        propose(owner, [{"path": f"{i}.txt", "operation": "create", "after": "."}]).json()[
            "proposal_id"
        ]
        for i in range(3)
    ]
    theirs = propose(other, [{"path": "t.txt", "operation": "create", "after": "."}]).json()
    client.post(f"/api/proposals/{mine[0]}/approve", headers=owner.auth)
    response = client.request("DELETE", "/api/proposals/all", headers=owner.auth)
    assert response.status_code == 200
    assert sorted(response.json()["rejected"]) == sorted(mine[1:])
    assert client.get("/api/proposals/pending", headers=owner.auth).json()["proposals"] == []
    their_pending = client.get("/api/proposals/pending", headers=other.auth).json()["proposals"]
    assert [p["proposal_id"] for p in their_pending] == [theirs["proposal_id"]]


def test_another_users_proposal_is_not_found(
    client: TestClient,
    owner: Owner,
    make_owner: Callable[[], Owner],
    propose: Propose,
    internal_token: str,
) -> None:
    intruder = make_owner()
    pid = propose(owner, [{"path": "s.txt", "operation": "create", "after": "s"}]).json()[
        "proposal_id"
    ]
    as_intruder = [
        intruder.auth,
        {"X-Signalbox-Internal-Token": internal_token, "X-Signalbox-User": intruder.user_id},
    ]
    for headers in as_intruder:
        assert client.get(f"/api/proposals/{pid}", headers=headers).status_code == 404
        assert client.post(f"/api/proposals/{pid}/approve", headers=headers).status_code == 404
        assert client.post(f"/api/proposals/{pid}/reject", headers=headers).status_code == 404
        assert client.get("/api/proposals/nope", headers=headers).status_code == 404
    assert not (owner.workspace / "s.txt").exists()
    # The owner, with the credentials the gateway acts for users with, still sees it pending.
    via_gateway = {"X-Signalbox-Internal-Token": internal_token, "X-Signalbox-User": owner.user_id}
    assert client.get(f"/api/proposals/{pid}", headers=via_gateway).json()["status"] == "pending"


def test_authentication_is_required(client: TestClient, owner: Owner, internal_token: str) -> None:
    assert client.get("/api/proposals/pending").status_code == 401
    bad = {"Authorization": "Bearer sbt_not-a-token"}
    assert client.get("/api/proposals/pending", headers=bad).status_code == 401
    wrong_internal = {"X-Signalbox-Internal-Token": "x" * 32, "X-Signalbox-User": owner.user_id}
    assert client.get("/api/proposals/pending", headers=wrong_internal).status_code == 401
    unknown_user = {"X-Signalbox-Internal-Token": internal_token, "X-Signalbox-User": "user_no"}
    assert client.get("/api/proposals/pending", headers=unknown_user).status_code == 401

    body = {
        "user_id": owner.user_id,
        "conversation_id": owner.conversation_id,
        "files": [{"path": "i.txt", "operation": "create", "after": "i"}],
    }
    assert client.post("/internal/proposals", json=body).status_code == 401
    assert client.post("/internal/proposals", json=body, headers=owner.auth).status_code == 401
    forged = {"X-Signalbox-Internal-Token": "y" * 32}
    assert client.post("/internal/proposals", json=body, headers=forged).status_code == 403
    assert not (owner.workspace / "i.txt").exists()


def test_create_refuses_bad_input(
    client: TestClient,
    owner: Owner,
    make_owner: Callable[[], Owner],
    propose: Propose,
    internal_token: str,
) -> None:
    (owner.workspace / "here.txt").write_text("here")
    cases = [
        ([{"path": "here.txt", "operation": "create", "after": "x"}], 409),
        ([{"path": "missing.txt", "operation": "update", "after": "x"}], 409),
        ([{"path": "here.txt", "operation": "update", "after": "x",
           "before_sha256": sha("not what is there")}], 409),
        ([{"path": "u.txt", "operation": "create"}], 422),
        ([{"path": "d.txt", "operation": "create", "after": "1"},
          {"path": "./d.txt", "operation": "create", "after": "2"}], 422),
        ([], 422),
    ]  # fmt: skip
    for files, status in cases:
        response = propose(owner, files)
        assert response.status_code == status, (files, response.text)
        assert "detail" in response.json()
    # A conversation of another user cannot receive this user's proposal.
    other = make_owner()
    response = client.post(
        "/internal/proposals",
        headers={"X-Signalbox-Internal-Token": internal_token},
        json={
            "user_id": owner.user_id,
            "conversation_id": other.conversation_id,
            "files": [{"path": "o.txt", "operation": "create", "after": "o"}],
        },
    )
    assert response.status_code == 404
    assert client.get("/api/proposals/pending", headers=owner.auth).json()["proposals"] == []


def test_redelivered_call_returns_the_same_proposal(
    client: TestClient, owner: Owner, internal_token: str
) -> None:
    body = {
        "user_id": owner.user_id,
        "conversation_id": owner.conversation_id,
        "call_id": "call_redelivered",
        "files": [{"path": "once.txt", "operation": "create", "after": "1"}],
    }
    headers = {"X-Signalbox-Internal-Token": internal_token}
    first = client.post("/internal/proposals", headers=headers, json=body)
    second = client.post("/internal/proposals", headers=headers, json=body)
    assert (first.status_code, second.status_code) == (201, 201)
    assert first.json()["proposal_id"] == second.json()["proposal_id"]


def test_overdue_proposal_expires(
    client: TestClient,
    ctx: ServiceContext,
    owner: Owner,
    propose: Propose,
    db_sessions: sessionmaker[Session],
) -> None:
    pid = propose(owner, [{"path": "late.txt", "operation": "create", "after": "l"}]).json()[
        "proposal_id"
    ]
    overdue = datetime.now(UTC) - timedelta(seconds=ctx.settings.proposal_ttl_s + 60)
    with db_sessions() as session:
        session.execute(update(Proposal).where(Proposal.id == pid).values(created_at=overdue))
        session.commit()
    assert client.get("/api/proposals/pending", headers=owner.auth).json()["proposals"] == []
    assert client.get(f"/api/proposals/{pid}", headers=owner.auth).json()["status"] == "expired"
    approve = client.post(f"/api/proposals/{pid}/approve", headers=owner.auth)
    assert approve.status_code == 409
    assert approve.json()["status"] == "expired"
    assert not (owner.workspace / "late.txt").exists()
    assert events_of(ctx, owner, "proposal_resolved") == [
        {"turn_id": "turn_test", "proposal_id": pid, "status": "expired"}
    ]


def test_start_up_relays_decisions_left_unannounced(
    client: TestClient,
    ctx: ServiceContext,
    owner: Owner,
    propose: Propose,
    db_sessions: sessionmaker[Session],
    service_env: dict[str, str],
) -> None:
    pid = propose(owner, [{"path": "c.txt", "operation": "create", "after": "c"}]).json()[
        "proposal_id"
    ]
    # A decision committed by a process that died before its relay ran.
    with db_sessions() as session:
        session.execute(update(Proposal).where(Proposal.id == pid).values(status="rejected"))
        payload = {
            "proposal_id": pid,
            "conversation_id": owner.conversation_id,
            "user_id": owner.user_id,
            "status": "rejected",
            "version": 2,
            "turn_id": "turn_test",
        }
        row = Outbox(topic="proposal_resolved", payload=payload)
        session.add(row)
        session.commit()
        row_id = row.id
    assert events_of(ctx, owner, "proposal_resolved") == []
    with TestClient(create_app()) as restarted:
        assert restarted.get("/readyz").status_code == 200
    assert events_of(ctx, owner, "proposal_resolved") == [
        {"turn_id": "turn_test", "proposal_id": pid, "status": "rejected"}
    ]
    with db_sessions() as session:
        sent = session.get(Outbox, row_id)
        assert sent is not None and sent.sent_at is not None


def test_health_and_readiness(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").status_code == 200
