"""The service's real entry point, as ``signalbox up`` and docker-compose start it."""

from __future__ import annotations

import threading
from collections.abc import Callable

import redis
from sqlalchemy.orm import Session, sessionmaker

from signalbox.shared.event_stream import EventStream
from signalbox.shared.redis_keys import RedisKeys
from tests import http_calls
from tests.proposals.conftest import Approvals, Owner, StartService, resolved_rows

DECIDERS = 50


def test_uvicorn_entry_point_serves_health_and_readiness(start_service: StartService) -> None:
    service = start_service()
    ready = http_calls.get(service.url("/readyz"))
    assert ready.status_code == 200, service.child.log_tail()
    anonymous = http_calls.get(service.url("/api/proposals/pending"))
    assert anonymous.status_code == 401


def test_fifty_concurrent_decisions_over_http_have_exactly_one_effect(
    start_service: StartService,
    make_owner: Callable[[], Owner],
    internal_token: str,
    approvals: Approvals,
    db_sessions: sessionmaker[Session],
    redis_client: redis.Redis,
    keys: RedisKeys,
) -> None:
    owner = make_owner()
    service = start_service()
    created = http_calls.post(
        service.url("/internal/proposals"),
        headers={"X-Signalbox-Internal-Token": internal_token},
        json={
            "user_id": owner.user_id,
            "conversation_id": owner.conversation_id,
            "files": [{"path": "race.txt", "operation": "create", "after": "won"}],
        },
    )
    assert created.status_code == 201, created.text
    pid = created.json()["proposal_id"]

    start = threading.Barrier(DECIDERS)
    answers: list[tuple[str, int, str]] = []
    lock = threading.Lock()

    def decide(action: str) -> None:
        with http_calls.Client(timeout=60) as http:
            start.wait()
            response = http.post(service.url(f"/api/proposals/{pid}/{action}"), headers=owner.auth)
        with lock:
            answers.append((action, response.status_code, response.json()["status"]))

    threads = [
        threading.Thread(target=decide, args=("approve" if i % 2 else "reject",))
        for i in range(DECIDERS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    assert len(answers) == DECIDERS, service.child.log_tail()

    outcomes = {status for _, _, status in answers}
    assert len(outcomes) == 1, answers  # every caller is told the one outcome
    outcome = outcomes.pop()
    assert outcome in {"applied", "rejected"}
    winner = "approve" if outcome == "applied" else "reject"
    assert all(code == (200 if action == winner else 409) for action, code, _ in answers), answers
    assert len(resolved_rows(db_sessions, pid)) == 1
    assert [m["status"] for m in approvals.published_for(pid)] == [outcome]
    stream = EventStream(redis_client, keys)
    resolved = [
        e.data for e in stream.read_after(owner.conversation_id, None)
        if e.kind == "proposal_resolved"
    ]  # fmt: skip
    assert resolved == [{"proposal_id": pid, "status": outcome}]
    assert (owner.workspace / "race.txt").exists() == (outcome == "applied")
