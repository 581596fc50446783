"""Orchestrator test fixtures: the fake Messages API, and a guard against real model calls.

The guard is autouse: ``ANTHROPIC_BASE_URL`` points at a closed local port and any HTTP
request (httpx or httpx2, which the ``anthropic`` SDK uses) to a non-local host is refused
and fails the test, so no test can reach api.anthropic.com or spend tokens.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import httpx2
import pytest
import redis
from sqlalchemy.orm import Session, sessionmaker

from signalbox.services.orchestrator.loop import Runtime
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.settings import OrchestratorSettings

from .support import Harness, ScriptedModel, ThreadDispatcher, make_conversation

LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
UNROUTABLE_BASE_URL = "http://127.0.0.1:9"  # the discard port: nothing listens, fails fast


def _guarded(original: Callable[..., Any], refused: list[str]) -> Callable[..., Any]:
    def handle_request(self: Any, request: Any) -> Any:
        host = str(request.url.host)
        if host not in LOCAL_HOSTS:
            refused.append(str(request.url))
            raise RuntimeError(f"tests may not reach a real model API, got a request to {host!r}")
        return original(self, request)

    return handle_request


def _guarded_async(original: Callable[..., Any], refused: list[str]) -> Callable[..., Any]:
    async def handle_async_request(self: Any, request: Any) -> Any:
        host = str(request.url.host)
        if host not in LOCAL_HOSTS:
            refused.append(str(request.url))
            raise RuntimeError(f"tests may not reach a real model API, got a request to {host!r}")
        return await original(self, request)

    return handle_async_request


@pytest.fixture(autouse=True)
def no_real_model_api(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Refuse every non-local HTTP request; a refused one fails the test at teardown."""
    refused: list[str] = []
    monkeypatch.setenv("ANTHROPIC_BASE_URL", UNROUTABLE_BASE_URL)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    for module in (httpx, httpx2):
        sync_transport: Any = module.HTTPTransport
        async_transport: Any = module.AsyncHTTPTransport
        monkeypatch.setattr(
            sync_transport, "handle_request", _guarded(sync_transport.handle_request, refused)
        )
        monkeypatch.setattr(
            async_transport,
            "handle_async_request",
            _guarded_async(async_transport.handle_async_request, refused),
        )
    yield refused
    assert not refused, f"a test tried to reach a real model API: {refused}"


@pytest.fixture
def test_keys(redis_prefix: str) -> RedisKeys:
    """Keys under a prefix of this test alone, so catalogues and leases never leak between tests."""
    return RedisKeys(f"{redis_prefix}orch-{uuid.uuid4().hex[:8]}:")


@pytest.fixture
def orch_settings(redis_url: str, database_url: str, test_keys: RedisKeys) -> OrchestratorSettings:
    """Orchestrator settings with short limits, so the unhappy paths take milliseconds."""
    return OrchestratorSettings(
        redis_url=redis_url,
        redis_prefix=test_keys.prefix,
        database_url=database_url,
        tool_grace_s=0.2,
        lease_s=5.0,
        max_steps=4,
    )


@pytest.fixture
def harness(
    orch_settings: OrchestratorSettings,
    db_sessions: sessionmaker[Session],
    redis_client: redis.Redis,
    test_keys: RedisKeys,
    make_user: Callable[[], tuple[str, str]],
) -> Harness:
    model = ScriptedModel()
    dispatcher = ThreadDispatcher(redis_client, test_keys, {})
    enqueued: list[str] = []
    runtime = Runtime(
        settings=orch_settings,
        sessions=db_sessions,
        redis=redis_client,
        keys=test_keys,
        model=model,
        dispatcher=dispatcher,
        enqueue_turn=enqueued.append,
        poll_s=0.05,
        cancel_check_s=0.05,
    )
    user_id, token = make_user()
    conversation_id = make_conversation(db_sessions, user_id)
    return Harness(runtime, model, dispatcher, enqueued, user_id, conversation_id, token)
