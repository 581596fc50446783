"""A real proposals process killed at the worst moments (``SIGNALBOX_TEST_FAULT``), restarted."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import httpx
import pytest
import redis
from sqlalchemy.orm import Session, sessionmaker

from services.proposals.apply import TEMP_PREFIX
from services.proposals.faults import EXIT_CODE
from shared.db import Proposal
from shared.event_stream import EventStream
from shared.redis_keys import RedisKeys
from tests.proposals.conftest import Approvals, Owner, ServiceProcess, StartService, resolved_rows


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def propose(service: ServiceProcess, owner: Owner, token: str, files: list[dict[str, str]]) -> str:
    response = httpx.post(
        service.url("/internal/proposals"),
        headers={"X-Signalbox-Internal-Token": token},
        json={"user_id": owner.user_id, "conversation_id": owner.conversation_id, "files": files},
        timeout=10,
    )
    assert response.status_code == 201, response.text
    pid: str = response.json()["proposal_id"]
    return pid


def approve_and_crash(service: ServiceProcess, owner: Owner, pid: str) -> None:
    with pytest.raises(httpx.HTTPError):  # the connection dies with the process
        httpx.post(service.url(f"/api/proposals/{pid}/approve"), headers=owner.auth, timeout=10)
    assert service.child.process is not None
    assert service.child.process.wait(timeout=10) == EXIT_CODE, service.child.log_tail()


def resolved(stream: EventStream, owner: Owner) -> list[dict[str, object]]:
    events = stream.read_after(owner.conversation_id, None)
    return [e.data for e in events if e.kind == "proposal_resolved"]


def status_of(db: sessionmaker[Session], pid: str) -> str:
    with db() as session:
        proposal = session.get(Proposal, pid)
        assert proposal is not None
        return proposal.status


@pytest.fixture
def stream(redis_client: redis.Redis, keys: RedisKeys) -> EventStream:
    return EventStream(redis_client, keys)


def test_killed_between_commit_and_publish_publishes_once_after_restart(
    start_service: StartService,
    make_owner: Callable[[], Owner],
    internal_token: str,
    approvals: Approvals,
    stream: EventStream,
    db_sessions: sessionmaker[Session],
) -> None:
    owner = make_owner()
    # No sweep in the doomed process, so only the restart can publish.
    doomed = start_service(
        SIGNALBOX_TEST_FAULT="crash_after_commit", SIGNALBOX_OUTBOX_SWEEP_S="3600"
    )
    files = [{"path": "c.txt", "operation": "create", "after": "c"}]
    pid = propose(doomed, owner, internal_token, files)
    approve_and_crash(doomed, owner, pid)

    assert status_of(db_sessions, pid) == "applied"  # committed...
    assert (owner.workspace / "c.txt").read_text() == "c"
    assert [r.sent_at for r in resolved_rows(db_sessions, pid)] == [None]  # ...never announced
    assert resolved(stream, owner) == []
    assert approvals.published_for(pid) == []

    restarted = start_service()  # its start-up relay runs before it answers /healthz
    assert resolved(stream, owner) == [{"proposal_id": pid, "status": "applied"}]
    assert [m["status"] for m in approvals.published_for(pid)] == ["applied"]
    again = httpx.post(restarted.url(f"/api/proposals/{pid}/approve"), headers=owner.auth)
    assert again.status_code == 200 and again.json()["status"] == "applied"
    assert resolved(stream, owner) == [{"proposal_id": pid, "status": "applied"}]
    assert approvals.published_for(pid) == []
    assert [r.sent_at is not None for r in resolved_rows(db_sessions, pid)] == [True]


def test_killed_between_temp_write_and_rename_leaves_every_file_old_or_new(
    start_service: StartService,
    make_owner: Callable[[], Owner],
    internal_token: str,
    stream: EventStream,
    db_sessions: sessionmaker[Session],
) -> None:
    owner = make_owner()
    old = {"a.txt": "a old\n" * 1000, "b.txt": "b old\n" * 1000}
    new = {"a.txt": "a new\n" * 1500, "b.txt": "b new\n" * 1500, "c.txt": "c new\n"}
    for name, text in old.items():
        (owner.workspace / name).write_text(text)
    # Killed at the second rename: a.txt is already replaced, b.txt's new content is in a temp.
    doomed = start_service(SIGNALBOX_TEST_FAULT="crash_before_rename@2")
    files = [
        {"path": "a.txt", "operation": "update", "after": new["a.txt"]},
        {"path": "b.txt", "operation": "update", "after": new["b.txt"]},
        {"path": "c.txt", "operation": "create", "after": new["c.txt"]},
    ]
    pid = propose(doomed, owner, internal_token, files)
    approve_and_crash(doomed, owner, pid)

    for name in ("a.txt", "b.txt", "c.txt"):
        path = owner.workspace / name
        content = path.read_text() if path.exists() else None
        assert content in (old.get(name), new[name]), name  # old or new, never partial
    assert (owner.workspace / "a.txt").read_text() == new["a.txt"]
    assert (owner.workspace / "b.txt").read_text() == old["b.txt"]
    leftovers = [p.name for p in owner.workspace.iterdir() if p.name.startswith(TEMP_PREFIX)]
    assert len(leftovers) == 1  # the temp file of b.txt, recognisable as ours
    assert status_of(db_sessions, pid) == "pending"  # the decision never committed

    # Approving again finishes the job: a.txt already holds its new content and is skipped.
    restarted = start_service()
    response = httpx.post(restarted.url(f"/api/proposals/{pid}/approve"), headers=owner.auth)
    assert response.status_code == 200, response.text
    for name, text in new.items():
        assert (owner.workspace / name).read_text() == text
    assert resolved(stream, owner) == [{"proposal_id": pid, "status": "applied"}]
