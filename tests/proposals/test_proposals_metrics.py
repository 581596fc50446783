"""``GET /metrics`` of the proposals service: proposals by status and the outbox's lag,
counted in SQL at each scrape (the real app on real SQL; no sweep runs in these tests)."""

from __future__ import annotations

from datetime import timedelta

from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import delete
from sqlalchemy.orm import Session, sessionmaker
from starlette.testclient import TestClient

from signalbox.shared.db import Outbox
from signalbox.shared.db.models import now
from tests.proposals.conftest import Owner, Propose


def samples(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    reply = client.get("/metrics")
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(reply.text)
        for s in family.samples
    }


def test_proposals_are_counted_by_status_at_each_scrape(
    client: TestClient, owner: Owner, propose: Propose
) -> None:
    pending = ("signalbox_proposals", (("status", "pending"),))
    before = samples(client).get(pending, 0.0)
    made = propose(owner, [{"path": "a.txt", "operation": "create", "after": "a\n"}])
    assert made.status_code == 201, made.text
    assert samples(client)[pending] == before + 1
    proposal_id = made.json()["proposal_id"]
    rejected = client.post(f"/api/proposals/{proposal_id}/reject", json={}, headers=owner.auth)
    assert rejected.status_code == 200, rejected.text
    after = samples(client)
    assert after[pending] == before
    assert after[("signalbox_proposals", (("status", "rejected"),))] >= 1


def test_outbox_lag_is_the_age_of_the_oldest_unsent_message(
    client: TestClient, db_sessions: sessionmaker[Session]
) -> None:
    with db_sessions() as session:
        stale = Outbox(
            topic="proposal_resolved",
            payload={"proposal_id": "p", "conversation_id": "c", "user_id": "u", "status": "x"},
            created_at=now() - timedelta(hours=2),
        )
        session.add(stale)
        session.commit()
        row_id = stale.id
    try:
        found = samples(client)
        assert found[("signalbox_outbox_lag_seconds", ())] >= 2 * 3600
        assert found[("signalbox_outbox_unsent", ())] >= 1
    finally:
        with db_sessions() as session:
            session.execute(delete(Outbox).where(Outbox.id == row_id))
            session.commit()
