"""The periodic outbox sweep: a decision committed while Redis was down goes out once it is back."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import pytest
import redis
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from starlette.testclient import TestClient

from signalbox.services.proposals import context, outbox
from signalbox.services.proposals.app import create_app
from signalbox.services.proposals.context import ServiceContext
from signalbox.shared.db import Outbox, Proposal
from signalbox.shared.event_stream import EventStream
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.settings import ProposalsSettings, load
from tests.proposals.conftest import Approvals, Owner
from tests.proposals.tcp_proxy import Proxy


def wait_for(check: Callable[[], bool], deadline_s: float = 10.0) -> None:
    """Poll ``check`` (another thread's progress) until it holds, or fail at the deadline."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    raise AssertionError(f"not true within {deadline_s} s: {check}")


def resolved_events(stream: EventStream, owner: Owner) -> list[dict[str, object]]:
    events = stream.read_after(owner.conversation_id, None)
    return [e.data for e in events if e.kind == "proposal_resolved"]


def unsent(db: sessionmaker[Session]) -> list[int]:
    with db() as session:
        return list(session.scalars(select(Outbox.id).where(Outbox.sent_at.is_(None))))


def test_decision_made_while_redis_is_down_is_published_once_when_it_is_back(
    make_owner: Callable[[], Owner],
    redis_url: str,
    redis_client: redis.Redis,
    keys: RedisKeys,
    internal_token: str,
    approvals: Approvals,
    db_sessions: sessionmaker[Session],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    owner = make_owner()
    real = urlsplit(redis_url)
    proxy = Proxy((real.hostname or "127.0.0.1", real.port or 6379))  # not started: Redis is down
    monkeypatch.setenv("SIGNALBOX_REDIS_URL", f"redis://127.0.0.1:{proxy.port}{real.path}")
    monkeypatch.setenv("SIGNALBOX_OUTBOX_SWEEP_S", "0.1")
    stream = EventStream(redis_client, keys)
    try:
        with TestClient(create_app()) as client:
            assert client.get("/readyz").status_code == 503
            created = client.post(
                "/internal/proposals",
                headers={"X-Signalbox-Internal-Token": internal_token},
                json={
                    "user_id": owner.user_id,
                    "conversation_id": owner.conversation_id,
                    "files": [{"path": "down.txt", "operation": "create", "after": "d"}],
                },
            )
            assert created.status_code == 201, created.text
            pid = created.json()["proposal_id"]
            approved = client.post(f"/api/proposals/{pid}/approve", headers=owner.auth)
            assert approved.status_code == 200, approved.text  # the decision is durable anyway
            assert (owner.workspace / "down.txt").read_text() == "d"
            assert len(unsent(db_sessions)) == 2  # created + resolved, waiting for Redis
            assert resolved_events(stream, owner) == []

            proxy.start()  # Redis is back
            wait_for(lambda: unsent(db_sessions) == [])
            assert resolved_events(stream, owner) == [{"proposal_id": pid, "status": "applied"}]
            assert [m["status"] for m in approvals.published_for(pid)] == ["applied"]
            ctx: ServiceContext = client.app.state.context  # type: ignore[attr-defined]
            assert outbox.relay(ctx) == 0  # a later sweep finds nothing left to send
            assert len(approvals.published_for(pid)) == 0
    finally:
        proxy.stop()
    assert resolved_events(stream, owner) == [{"proposal_id": pid, "status": "applied"}]


def test_sweep_publishes_an_unsent_row_and_expires_overdue_proposals(
    client: TestClient,
    ctx: ServiceContext,
    owner: Owner,
    approvals: Approvals,
    db_sessions: sessionmaker[Session],
    monkeypatch: pytest.MonkeyPatch,
    service_env: dict[str, str],
) -> None:
    monkeypatch.setenv("SIGNALBOX_OUTBOX_SWEEP_S", "0.1")
    pid = f"prop_{uuid.uuid4().hex[:12]}"
    overdue = datetime.now(UTC) - timedelta(seconds=ctx.settings.proposal_ttl_s + 60)
    with db_sessions() as session:
        session.add(
            Proposal(
                id=pid,
                user_id=owner.user_id,
                conversation_id=owner.conversation_id,
                workspace="default",
                summary="forgotten",
                created_at=overdue,
            )
        )
        session.commit()
    before = sweeper_threads()
    with TestClient(create_app()) as swept:
        assert sweeper_threads() == before + 1
        # Nobody reads the proposal: the sweep alone expires and announces it.
        wait_for(lambda: status_of(db_sessions, pid) == "expired")
        wait_for(lambda: unsent(db_sessions) == [])
        assert [m["status"] for m in approvals.published_for(pid)] == ["expired"]
        assert swept.get(f"/api/proposals/{pid}", headers=owner.auth).json()["status"] == "expired"
    assert sweeper_threads() == before  # shut down with the app, not left running


def status_of(db: sessionmaker[Session], pid: str) -> str | None:
    with db() as session:
        found = session.get(Proposal, pid)
        return None if found is None else found.status


def sweeper_threads() -> int:
    return [t.name for t in threading.enumerate()].count("proposals-sweeper")


def test_a_redis_that_never_answers_holds_a_publish_for_one_try_only(
    service_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The relay publishes inside the transaction that holds its outbox row's lock, and the
    # server ends a session idle in a transaction after IDLE_IN_TRANSACTION_S (30 s). A
    # client redis-py 8 builds from host and port retries a timeout ten times (eleven tries
    # of 5 s here); one from a URL, as the service's, tries once: keep it so.
    silent = socket.create_server(("127.0.0.1", 0), backlog=64)  # the kernel accepts; no reply
    monkeypatch.setattr(context, "REDIS_TIMEOUT_S", 0.2)
    monkeypatch.setenv("SIGNALBOX_REDIS_URL", f"redis://127.0.0.1:{silent.getsockname()[1]}/0")
    ctx = ServiceContext.from_settings(load(ProposalsSettings))
    try:
        with pytest.raises(redis.TimeoutError):
            outbox.publish(
                ctx,
                outbox.PROPOSAL_RESOLVED,
                {"proposal_id": "prop_x", "status": "applied", "conversation_id": "conv_x"},
            )
        tries = _connections_waiting(silent)
    finally:
        ctx.close()
        silent.close()
    assert tries == 1


def _connections_waiting(listener: socket.socket) -> int:
    """How many connections the kernel completed on ``listener`` (each one try)."""
    listener.setblocking(False)
    count = 0
    while True:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            return count
        conn.close()
        count += 1
