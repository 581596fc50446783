"""Fixtures of the tool-worker tests: a user's real workspace, a conversation, tool contexts.

``tool_env`` holds a workspace with a few files, and a directory outside it holding a
secret that no tool may ever reveal. ``proposals_http`` is a client of the real proposals service
on real uvicorn, used by the write tools.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import uvicorn
from sqlalchemy.orm import Session, sessionmaker

from signalbox.processes import Child, ServiceCommands, child_env, log_contains
from signalbox.redis_server import free_port
from signalbox.services.tools.catalogue import load_tools
from signalbox.services.tools.execution import execute
from signalbox.services.tools.proposals_client import make_client
from signalbox.services.tools.registry import Registry, ToolContext
from signalbox.shared.db import Conversation
from signalbox.shared.ids import new_id
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.settings import ProposalsSettings, ToolsSettings, load
from signalbox.shared.tool_contract import ToolCallRequest, ToolResult
from signalbox.shared.workspace_paths import workspace_dir
from tests import http_calls

SERVER_START_TIMEOUT_S = 10.0
SECRET = "TOPSECRET-d41d8cd9"  # written only outside the workspace
WORKSPACE = "proj"


@dataclass
class ToolEnv:
    """One user's conversation and workspace, plus the outside directory tests attack."""

    settings: ToolsSettings
    user_id: str
    conversation_id: str
    workspace: Path
    outside: Path
    redis: redis.Redis
    keys: RedisKeys
    registry: Registry
    proposals: httpx.Client

    def context(self, call_id: str | None = None, **overrides: Any) -> ToolContext:
        """A context for one call (settings may be overridden per test)."""
        settings = self.settings.model_copy(update=overrides) if overrides else self.settings
        return ToolContext(
            workspace=self.workspace,
            user_id=self.user_id,
            conversation_id=self.conversation_id,
            turn_id="turn_test",
            call_id=call_id or new_id("call"),
            workspace_name=WORKSPACE,
            settings=settings,
            proposals=self.proposals,
            redis=self.redis,
            keys=self.keys,
        )

    def request(self, tool: str, **tool_input: Any) -> ToolCallRequest:
        """A call of ``tool`` as the orchestrator would send it."""
        return ToolCallRequest(
            call_id=new_id("call"),
            turn_id=new_id("turn"),
            conversation_id=self.conversation_id,
            user_id=self.user_id,
            workspace=WORKSPACE,
            tool=tool,
            input=tool_input,
            timeout_s=10,
        )

    def run(self, tool: str, **tool_input: Any) -> ToolResult:
        """Run ``tool`` through ``execute`` exactly as a worker does."""
        request = self.request(tool, **tool_input)
        return execute(request, self.context(request.call_id), self.registry)

    def run_with(self, settings: dict[str, Any], tool: str, **tool_input: Any) -> ToolResult:
        """``run`` with some settings overridden."""
        request = self.request(tool, **tool_input)
        return execute(request, self.context(request.call_id, **settings), self.registry)


@contextlib.contextmanager
def one_slot_worker(tmp_path: Path, settings: Mapping[str, str] = {}) -> Iterator[Child]:
    """A real tools worker on queue ``tools`` with ONE pool process (consecutive calls share
    its pid), the test tools, no sandbox, and ``settings`` in its environment."""
    name = f"tools-{uuid.uuid4().hex[:8]}"
    overrides = {"SIGNALBOX_TEST_TOOLS": "1", "SIGNALBOX_SANDBOX": "off", **settings}
    child = Child(
        name=name,
        args=ServiceCommands(tools_concurrency=1).tools(f"{name}@%h", queues="tools"),
        log_path=tmp_path / f"{name}.log",
        env=child_env(os.environ, overrides),
    )
    child.start()
    try:
        child.wait_ready(log_contains(child, " ready."))
        yield child
    finally:
        child.stop()


@pytest.fixture
def tool_env(
    service_env: dict[str, str],
    make_user: Callable[[], tuple[str, str]],
    db_sessions: sessionmaker[Session],
    redis_client: redis.Redis,
    keys: RedisKeys,
    tmp_path: Path,
    tools_workspaces_root: Path,
) -> Iterator[ToolEnv]:
    settings = load(ToolsSettings).model_copy(update={"workspaces_root": tools_workspaces_root})
    user_id, _token = make_user()
    conversation_id = new_id("conv")
    with db_sessions() as session:
        session.add(Conversation(id=conversation_id, user_id=user_id, workspace=WORKSPACE))
        session.commit()
    workspace = workspace_dir(settings.workspaces_root, user_id, WORKSPACE)
    workspace.mkdir(parents=True)
    (workspace / "hello.txt").write_text("line one\nline two\nline three\n")
    (workspace / "sub").mkdir()
    (workspace / "sub" / "code.py").write_text("def main():\n    return 42\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET + "\n")
    unused = http_calls.Client(base_url="http://127.0.0.1:9")  # read tests never reach proposals
    yield ToolEnv(
        settings=settings,
        user_id=user_id,
        conversation_id=conversation_id,
        workspace=workspace,
        outside=outside,
        redis=redis_client,
        keys=keys,
        registry=load_tools({}),
        proposals=unused,
    )
    unused.close()


@pytest.fixture(scope="session")
def sandbox_ready() -> None:
    """Skip where the sandbox cannot hold (saying why); in CI, fail instead of skipping.

    CI runs on the machine kind the sandbox is built for (root, bubblewrap from apt, a
    memory cgroup), so a sandbox test that does not run there is a failure, not a skip.
    """
    from signalbox.services.tools.sandbox import unavailable

    reason = unavailable()
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the sandbox tests, but the sandbox cannot hold here: {reason}")
    pytest.skip(f"the sandbox cannot hold here: {reason}")


@pytest.fixture(scope="session")
def tools_workspaces_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One workspaces root for these tests and the proposals server (users never collide)."""
    return tmp_path_factory.mktemp("tools-workspaces")


@pytest.fixture(scope="session")
def proposals_url(
    redis_url: str,
    redis_prefix: str,
    database_url: str,
    internal_token: str,
    tools_workspaces_root: Path,
) -> Iterator[str]:
    """The real proposals service on real uvicorn (in a thread), shared by the write tests."""
    from signalbox.services.proposals.app import create_app

    settings = ProposalsSettings(
        redis_url=redis_url,
        redis_prefix=redis_prefix,
        database_url=database_url,
        internal_token=internal_token,
        workspaces_root=tools_workspaces_root,
    )
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, name="proposals-under-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while not server.started:  # set by uvicorn once it listens
        assert thread.is_alive() and time.monotonic() < deadline, "proposals did not start"
        time.sleep(0.01)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture
def proposals_http(
    tool_env: ToolEnv, proposals_url: str, internal_token: str
) -> Iterator[httpx.Client]:
    """The write tools' client, pointed at the real proposals service."""
    with make_client(proposals_url, internal_token) as client:
        tool_env.proposals = client
        yield client


def unique(prefix: str) -> str:
    """A name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
