"""Quotas the proposals service enforces: pending proposals per user and the bytes of a
user's workspaces. A refused proposal is a 403 ``quota_exceeded`` that names the quota, and
stores nothing: no row, no event."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker
from starlette.testclient import TestClient

from signalbox.services.proposals.context import ServiceContext
from signalbox.shared.db import Proposal, UserLimits
from tests.proposals.conftest import Owner, Propose, events_of


def _limit(db: sessionmaker[Session], owner: Owner, **quotas: int) -> None:
    with db() as s, s.begin():
        s.add(UserLimits(user_id=owner.user_id, quotas=quotas))


def _stored(db: sessionmaker[Session], owner: Owner) -> int:
    with db() as s:
        count = s.scalar(
            select(func.count()).select_from(Proposal).where(Proposal.user_id == owner.user_id)
        )
    return int(count or 0)


def test_pending_proposals_past_the_quota_are_refused(
    client: TestClient,
    ctx: ServiceContext,
    owner: Owner,
    propose: Propose,
    db_sessions: sessionmaker[Session],
) -> None:
    _limit(db_sessions, owner, pending_proposals=2)
    for name in ("a", "b"):
        created = propose(owner, [{"path": f"{name}.txt", "operation": "create", "after": "x"}])
        assert created.status_code == 201, created.text
    refused = propose(owner, [{"path": "c.txt", "operation": "create", "after": "x"}])
    assert refused.status_code == 403
    assert refused.json()["code"] == "quota_exceeded"
    assert refused.json()["quota"] == "pending_proposals"
    assert _stored(db_sessions, owner) == 2
    assert len(events_of(ctx, owner, "proposal_created")) == 2
    # A decision frees a slot.
    first = client.get("/api/proposals/pending", headers=owner.auth).json()["proposals"][0]
    first = first["proposal_id"]
    rejected = client.post(f"/api/proposals/{first}/reject", headers=owner.auth)
    assert rejected.status_code == 200, rejected.text
    again = propose(owner, [{"path": "c.txt", "operation": "create", "after": "x"}])
    assert again.status_code == 201, again.text


def test_a_proposal_that_would_overfill_the_workspaces_is_refused(
    owner: Owner,
    propose: Propose,
    db_sessions: sessionmaker[Session],
) -> None:
    _limit(db_sessions, owner, workspace_bytes=1000)
    (owner.workspace / "big.txt").write_text("b" * 900)
    fits = propose(owner, [{"path": "small.txt", "operation": "create", "after": "s" * 100}])
    assert fits.status_code == 201, fits.text
    over = propose(owner, [{"path": "more.txt", "operation": "create", "after": "m" * 101}])
    assert over.status_code == 403
    assert over.json()["quota"] == "workspace_bytes"
    assert "900 held" in over.json()["detail"]
    # Shrinking is never refused for bytes, even at the limit.
    (owner.workspace / "pad.txt").write_text("p" * 200)
    shrink = propose(owner, [{"path": "big.txt", "operation": "update", "after": "b"}])
    assert shrink.status_code == 201, shrink.text
    assert _stored(db_sessions, owner) == 2
