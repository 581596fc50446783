"""Fixtures of the proposals tests: the real app on real Redis and SQL, users with conversations."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest
import redis
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from starlette.testclient import TestClient

from signalbox.processes import Child, ServiceCommands, child_env, http_ok
from signalbox.redis_server import free_port
from signalbox.services.proposals.app import create_app
from signalbox.services.proposals.context import ServiceContext
from signalbox.shared.db import Conversation, Outbox
from signalbox.shared.redis_keys import RedisKeys


class Response(Protocol):
    """What the tests read of a TestClient response (whichever httpx starlette bundles)."""

    status_code: int

    @property
    def text(self) -> str: ...

    def json(self) -> Any: ...


Propose = Callable[..., Response]


@dataclass
class Owner:
    """A user with a token and one conversation in workspace ``default``."""

    user_id: str
    token: str
    conversation_id: str
    workspace: Path

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@pytest.fixture
def client(service_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    # No background sweep unless a test asks for one: tests look at unsent outbox rows.
    monkeypatch.setenv("SIGNALBOX_OUTBOX_SWEEP_S", "3600")
    with TestClient(create_app()) as c:
        yield c


@pytest.fixture
def ctx(client: TestClient) -> ServiceContext:
    context: ServiceContext = client.app.state.context  # type: ignore[attr-defined]
    return context


@pytest.fixture
def make_owner(
    make_user: Callable[[], tuple[str, str]],
    db_sessions: sessionmaker[Session],
    service_env: dict[str, str],
) -> Callable[[], Owner]:
    """A factory of users, each with a conversation and an (existing) workspace directory."""

    def make() -> Owner:
        user_id, token = make_user()
        conversation_id = f"conv_{uuid.uuid4().hex[:12]}"
        with db_sessions() as session:
            session.add(Conversation(id=conversation_id, user_id=user_id, workspace="default"))
            session.commit()
        workspace = Path(service_env["SIGNALBOX_WORKSPACES_ROOT"]).resolve() / user_id / "default"
        workspace.mkdir(parents=True)
        return Owner(user_id, token, conversation_id, workspace)

    return make


@pytest.fixture
def owner(make_owner: Callable[[], Owner]) -> Owner:
    return make_owner()


@pytest.fixture
def propose(client: TestClient, internal_token: str) -> Propose:
    """Call ``POST /internal/proposals`` as a tool worker would."""

    def call(who: Owner, files: list[dict[str, Any]], summary: str = "change") -> Response:
        return client.post(
            "/internal/proposals",
            headers={"X-Signalbox-Internal-Token": internal_token},
            json={
                "user_id": who.user_id,
                "conversation_id": who.conversation_id,
                "turn_id": "turn_test",
                "call_id": f"call_{uuid.uuid4().hex[:12]}",
                "workspace": "default",
                "summary": summary,
                "files": files,
            },
        )

    return call


def events_of(ctx: ServiceContext, owner: Owner, kind: str) -> list[dict[str, Any]]:
    return [
        {"turn_id": e.turn_id, **e.data}
        for e in ctx.events.read_after(owner.conversation_id, None)
        if e.kind == kind
    ]


def resolved_rows(db: sessionmaker[Session], proposal_id: str) -> list[Outbox]:
    with db() as session:
        rows = session.scalars(select(Outbox).where(Outbox.topic == "proposal_resolved")).all()
    return [r for r in rows if r.payload["proposal_id"] == proposal_id]


@dataclass
class Approvals:
    """A subscriber of the approvals channel that can tell when it has seen everything so far."""

    pubsub: redis.client.PubSub
    client: redis.Redis
    sentinel: str

    def published_for(self, proposal_id: str, deadline_s: float = 5.0) -> list[Any]:
        """Every approvals message about ``proposal_id`` published before this call."""
        # Redis delivers to one subscriber in publish order, so once our sentinel (published
        # now, on a private channel) arrives, every earlier approval has arrived too.
        self.client.publish(self.sentinel, "end")
        found: list[Any] = []
        deadline = time.monotonic() + deadline_s
        while (remaining := deadline - time.monotonic()) > 0:
            message = self.pubsub.get_message(timeout=remaining)
            if message is None or message["type"] != "message":
                continue
            if message["channel"].decode() == self.sentinel:
                return found
            payload = json.loads(message["data"])
            if payload["proposal_id"] == proposal_id:
                found.append(payload)
        raise AssertionError(f"sentinel not received within {deadline_s} s")


@pytest.fixture
def approvals(redis_client: redis.Redis, keys: RedisKeys) -> Iterator[Approvals]:
    sentinel = f"{keys.prefix}test-sentinel:{uuid.uuid4().hex}"  # a test-only channel
    pubsub = redis_client.pubsub()  # type: ignore[no-untyped-call]
    pubsub.subscribe(keys.approvals_channel, sentinel)
    for _ in range(2):
        confirmed = pubsub.get_message(timeout=5)
        assert confirmed is not None and confirmed["type"] == "subscribe"
    yield Approvals(pubsub, redis_client, sentinel)
    pubsub.close()


@dataclass
class ServiceProcess:
    """A proposals service running as a real uvicorn process."""

    child: Child
    base_url: str

    def url(self, path: str) -> str:
        return self.base_url + path


StartService = Callable[..., ServiceProcess]


@pytest.fixture
def start_service(service_env: dict[str, str], tmp_path: Path) -> Iterator[StartService]:
    """A factory: ``start(**extra_env)`` runs the real entry point and waits until it answers."""
    started: list[Child] = []

    def start(**extra_env: str) -> ServiceProcess:
        port = free_port()
        child = Child(
            name="proposals",
            args=ServiceCommands().proposals(port),
            log_path=tmp_path / f"proposals-{len(started)}.log",
            env=child_env(os.environ, {**service_env, **extra_env}),
        )
        started.append(child)
        child.start()
        base = f"http://127.0.0.1:{port}"
        child.wait_ready(http_ok(base + "/healthz"), timeout_s=30)
        return ServiceProcess(child, base)

    yield start
    for child in started:
        child.stop()
