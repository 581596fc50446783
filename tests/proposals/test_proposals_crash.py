"""A real proposals process killed at the worst moments (``SIGNALBOX_TEST_FAULT``), restarted."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator

import httpx
import pytest
import redis
from sqlalchemy.orm import Session, sessionmaker

from signalbox.services.proposals.faults import EXIT_CODE
from signalbox.services.proposals.journal import JOURNAL_DIR, TEMP_PREFIX
from signalbox.shared.db import Proposal, make_engine, make_session_factory
from signalbox.shared.event_stream import EventStream
from signalbox.shared.redis_keys import RedisKeys
from tests import http_calls
from tests.databases import database_for
from tests.proposals.conftest import Approvals, Owner, ServiceProcess, StartService, resolved_rows


@pytest.fixture(scope="module")
def database_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A database of this module's own: a crashed decision's outbox row stays unsent until the
    restart, and no other service of the test session (the shared ``stack``) may relay it."""
    return database_for(request, tmp_path_factory.mktemp("crash-sql"), "crash")


@pytest.fixture(scope="module")
def db_sessions(database_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(database_url)
    yield make_session_factory(engine)
    engine.dispose()


OLD = {"a.txt": "a old\n" * 1000, "b.txt": "b old\n" * 1000}
NEW = {"a.txt": "a new\n" * 1500, "b.txt": "b new\n" * 1500, "sub/c.txt": "c new\n"}


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def propose(service: ServiceProcess, owner: Owner, token: str, files: list[dict[str, str]]) -> str:
    response = http_calls.post(
        service.url("/internal/proposals"),
        headers={"X-Signalbox-Internal-Token": token},
        json={"user_id": owner.user_id, "conversation_id": owner.conversation_id, "files": files},
    )
    assert response.status_code == 201, response.text
    pid: str = response.json()["proposal_id"]
    return pid


def approve_and_crash(service: ServiceProcess, owner: Owner, pid: str) -> None:
    with pytest.raises(httpx.HTTPError):  # the connection dies with the process
        http_calls.post(service.url(f"/api/proposals/{pid}/approve"), headers=owner.auth)
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

    assert journals(owner) != []  # the apply committed, its journal was not yet dropped

    restarted = start_service()  # its start-up relay runs before it answers /healthz
    assert (owner.workspace / "c.txt").read_text() == "c"  # committed: never rolled back
    assert journals(owner) == []
    assert resolved(stream, owner) == [{"proposal_id": pid, "status": "applied"}]
    assert [m["status"] for m in approvals.published_for(pid)] == ["applied"]
    again = http_calls.post(restarted.url(f"/api/proposals/{pid}/approve"), headers=owner.auth)
    assert again.status_code == 200 and again.json()["status"] == "applied"
    assert resolved(stream, owner) == [{"proposal_id": pid, "status": "applied"}]
    assert approvals.published_for(pid) == []
    assert [r.sent_at is not None for r in resolved_rows(db_sessions, pid)] == [True]


def journals(owner: Owner) -> list[str]:
    """The apply journals of the test's workspaces root (beside the users' directories)."""
    root = owner.workspace.parent.parent / JOURNAL_DIR
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def temp_files(owner: Owner) -> list[str]:
    return sorted(p.name for p in owner.workspace.rglob(TEMP_PREFIX + "*"))


def contents(owner: Owner) -> dict[str, str | None]:
    names = sorted({*OLD, *NEW})
    paths = {name: owner.workspace / name for name in names}
    return {name: p.read_text() if p.exists() else None for name, p in paths.items()}


def crash_mid_apply(
    start_service: StartService, owner: Owner, internal_token: str, db: sessionmaker[Session]
) -> str:
    """Approve a three-file proposal in a process killed at its second rename; the pid."""
    for name, text in OLD.items():
        (owner.workspace / name).write_text(text)
    # Killed at the second rename: a.txt is already replaced, b.txt's new content is in a temp.
    doomed = start_service(SIGNALBOX_TEST_FAULT="crash_before_rename@2")
    files = [
        {"path": "a.txt", "operation": "update", "after": NEW["a.txt"]},
        {"path": "b.txt", "operation": "update", "after": NEW["b.txt"]},
        {"path": "sub/c.txt", "operation": "create", "after": NEW["sub/c.txt"]},
    ]
    pid = propose(doomed, owner, internal_token, files)
    approve_and_crash(doomed, owner, pid)

    # What the crash left: each file whole, but the set mixed; SQL still says pending.
    assert contents(owner) == {"a.txt": NEW["a.txt"], "b.txt": OLD["b.txt"], "sub/c.txt": None}
    assert len(temp_files(owner)) == 1  # b.txt's temp, recognisable as ours
    assert [name.partition(".")[0] for name in journals(owner)] == [pid]
    assert status_of(db, pid) == "pending"
    return pid


def test_killed_between_temp_write_and_rename_is_rolled_back_then_approve_applies_all(
    start_service: StartService,
    make_owner: Callable[[], Owner],
    internal_token: str,
    stream: EventStream,
    db_sessions: sessionmaker[Session],
) -> None:
    owner = make_owner()
    pid = crash_mid_apply(start_service, owner, internal_token, db_sessions)

    restarted = start_service()  # its start-up recovery runs before it answers /healthz
    assert contents(owner) == {**OLD, "sub/c.txt": None}  # exactly as before the approval
    assert temp_files(owner) == [] and journals(owner) == []
    assert not (owner.workspace / "sub").exists()
    assert status_of(db_sessions, pid) == "pending"

    response = http_calls.post(restarted.url(f"/api/proposals/{pid}/approve"), headers=owner.auth)
    assert response.status_code == 200, response.text
    assert contents(owner) == NEW
    assert journals(owner) == []
    assert resolved(stream, owner) == [{"proposal_id": pid, "status": "applied"}]


def test_killed_between_temp_write_and_rename_then_rejected_leaves_every_file_old(
    start_service: StartService,
    make_owner: Callable[[], Owner],
    internal_token: str,
    stream: EventStream,
    db_sessions: sessionmaker[Session],
) -> None:
    owner = make_owner()
    pid = crash_mid_apply(start_service, owner, internal_token, db_sessions)

    restarted = start_service()
    response = http_calls.post(
        restarted.url(f"/api/proposals/{pid}/reject"), headers=owner.auth, json={"reason": "no"}
    )
    assert response.status_code == 200 and response.json()["status"] == "rejected"
    assert contents(owner) == {**OLD, "sub/c.txt": None}
    assert temp_files(owner) == [] and journals(owner) == []
    assert resolved(stream, owner) == [{"proposal_id": pid, "status": "rejected"}]
