"""Approving only some files of a proposal: they split off into a child; the rest stay pending."""

from __future__ import annotations

import hashlib
import threading

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from starlette.testclient import TestClient

from signalbox.services.proposals.context import ServiceContext
from signalbox.shared.db import Proposal
from tests.proposals.conftest import Approvals, Owner, Propose, events_of, resolved_rows


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def three_files(owner: Owner, propose: Propose) -> str:
    (owner.workspace / "a.txt").write_text("a1\n")
    (owner.workspace / "c.txt").write_text("c1\n")
    response = propose(
        owner,
        [
            {"path": "a.txt", "operation": "update", "after": "a2\n"},
            {"path": "b.txt", "operation": "create", "after": "b\n"},
            {"path": "c.txt", "operation": "delete"},
        ],
        summary="three",
    )
    assert response.status_code == 201, response.text
    pid: str = response.json()["proposal_id"]
    return pid


def test_approving_some_files_applies_them_and_keeps_the_rest_pending(
    client: TestClient,
    ctx: ServiceContext,
    owner: Owner,
    propose: Propose,
    approvals: Approvals,
    db_sessions: sessionmaker[Session],
) -> None:
    pid = three_files(owner, propose)
    response = client.post(
        f"/api/proposals/{pid}/approve", headers=owner.auth, json={"files": ["c.txt", "b.txt"]}
    )
    assert response.status_code == 200, response.text
    part = response.json()
    assert part["status"] == "applied"
    assert part["parent_id"] == pid and part["proposal_id"] != pid
    assert [f["path"] for f in part["files"]] == ["b.txt", "c.txt"]
    assert part["decided_by"] == owner.user_id
    assert (owner.workspace / "b.txt").read_text() == "b\n"
    assert not (owner.workspace / "c.txt").exists()
    assert (owner.workspace / "a.txt").read_text() == "a1\n"  # not chosen: untouched

    rest = client.get(f"/api/proposals/{pid}", headers=owner.auth).json()
    assert rest["status"] == "pending"
    assert [f["path"] for f in rest["files"]] == ["a.txt"]
    assert rest["version"] == 2  # changed, so a reader holding version 1 knows to reload
    pending = client.get("/api/proposals/pending", headers=owner.auth).json()["proposals"]
    assert [p["proposal_id"] for p in pending] == [pid]

    child = part["proposal_id"]
    created = events_of(ctx, owner, "proposal_created")
    assert created[-1] == {
        "turn_id": "turn_test",
        "proposal_id": child,
        "summary": "three",
        "files": [
            {"path": "b.txt", "operation": "create"},
            {"path": "c.txt", "operation": "delete"},
        ],
        "parent_id": pid,
        "reverts": None,
    }
    assert created[0]["parent_id"] is None  # an ordinary proposal has no parent
    assert events_of(ctx, owner, "proposal_resolved") == [
        {"turn_id": "turn_test", "proposal_id": child, "status": "applied"}
    ]
    assert [m["status"] for m in approvals.published_for(child)] == ["applied"]
    assert approvals.published_for(pid) == []

    # A retry of the same partial approval is harmless: same answer, nothing new.
    again = client.post(
        f"/api/proposals/{pid}/approve", headers=owner.auth, json={"files": ["b.txt", "c.txt"]}
    )
    assert again.status_code == 200 and again.json()["proposal_id"] == child
    assert len(resolved_rows(db_sessions, child)) == 1

    # The rest is approved on its own, under the original id.
    last = client.post(f"/api/proposals/{pid}/approve", headers=owner.auth)
    assert last.status_code == 200 and last.json()["status"] == "applied"
    assert (owner.workspace / "a.txt").read_text() == "a2\n"
    assert [m["status"] for m in approvals.published_for(pid)] == ["applied"]
    with db_sessions() as session:
        children = session.scalars(select(Proposal.id).where(Proposal.parent_id == pid)).all()
    assert list(children) == [child]


def test_a_stale_chosen_file_is_a_conflict_of_that_part_only(
    client: TestClient, ctx: ServiceContext, owner: Owner, propose: Propose
) -> None:
    pid = three_files(owner, propose)
    (owner.workspace / "a.txt").write_text("edited meanwhile\n")
    response = client.post(
        f"/api/proposals/{pid}/approve", headers=owner.auth, json={"files": ["a.txt", "b.txt"]}
    )
    assert response.status_code == 409
    body = response.json()
    assert body["status"] == "conflict" and body["proposal_id"] != pid
    assert {f["path"] for f in body["files"]} == {"a.txt", "b.txt"}
    assert (owner.workspace / "a.txt").read_text() == "edited meanwhile\n"
    assert not (owner.workspace / "b.txt").exists()  # all or nothing within the part
    rest = client.get(f"/api/proposals/{pid}", headers=owner.auth).json()
    assert (rest["status"], [f["path"] for f in rest["files"]]) == ("pending", ["c.txt"])
    assert events_of(ctx, owner, "proposal_resolved") == [
        {"turn_id": "turn_test", "proposal_id": body["proposal_id"], "status": "conflict"}
    ]
    approved = client.post(f"/api/proposals/{pid}/approve", headers=owner.auth)
    assert approved.status_code == 200
    assert not (owner.workspace / "c.txt").exists()


def test_unknown_or_no_files_are_refused_and_change_nothing(
    client: TestClient, ctx: ServiceContext, owner: Owner, propose: Propose
) -> None:
    pid = three_files(owner, propose)
    for files in (["a.txt", "nope.txt"], []):
        response = client.post(
            f"/api/proposals/{pid}/approve", headers=owner.auth, json={"files": files}
        )
        assert response.status_code == 422, response.text
        assert "detail" in response.json()
    proposal = client.get(f"/api/proposals/{pid}", headers=owner.auth).json()
    assert (proposal["status"], proposal["version"], len(proposal["files"])) == ("pending", 1, 3)
    assert (owner.workspace / "a.txt").read_text() == "a1\n"
    assert events_of(ctx, owner, "proposal_resolved") == []
    # Naming every file is the same as approving the whole proposal: no split.
    whole = client.post(
        f"/api/proposals/{pid}/approve",
        headers=owner.auth,
        json={"files": ["c.txt", "b.txt", "a.txt"]},
    )
    assert whole.status_code == 200 and whole.json()["proposal_id"] == pid


def test_concurrent_approvals_of_the_same_files_split_once(
    client: TestClient, owner: Owner, propose: Propose, db_sessions: sessionmaker[Session]
) -> None:
    pid = three_files(owner, propose)
    start = threading.Barrier(10)
    answers: list[tuple[int, str]] = []
    lock = threading.Lock()

    def approve_b() -> None:
        start.wait()
        response = client.post(
            f"/api/proposals/{pid}/approve", headers=owner.auth, json={"files": ["b.txt"]}
        )
        with lock:
            answers.append((response.status_code, response.json().get("proposal_id", "")))

    threads = [threading.Thread(target=approve_b) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(answers) == 10
    assert {code for code, _ in answers} == {200}, answers
    assert len({child for _, child in answers}) == 1  # everyone is told the one split
    with db_sessions() as session:
        children = session.scalars(select(Proposal).where(Proposal.parent_id == pid)).all()
    assert len(children) == 1
    assert len(resolved_rows(db_sessions, children[0].id)) == 1
