"""Fixtures of the proposals tests: the real app on real Redis and SQL, users with conversations."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest
from sqlalchemy.orm import Session, sessionmaker
from starlette.testclient import TestClient

from services.proposals.app import create_app
from services.proposals.context import ServiceContext
from shared.db import Conversation


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
def client(service_env: dict[str, str]) -> Iterator[TestClient]:
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
