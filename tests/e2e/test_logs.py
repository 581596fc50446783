"""Every service's log of one turn, read as an operator would: JSON lines, the turn's id on
lines of each service it crossed, and no secret anywhere.

Its own stack (``SIGNALBOX_LOG_FORMAT=json``), the model being the fake Messages API with a
real-looking API key, so the key is in every orchestrator's environment to leak.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker
from websockets.sync.client import connect

from signalbox.client import Client, WebSocket
from signalbox.processes import Child, wait_until
from signalbox.shared.db import make_engine, make_session_factory
from signalbox.shared.db.users import create_user
from signalbox.shared.events import Event
from signalbox.stack import Stack, StackConfig
from tests.databases import database_for
from tests.fake_anthropic import FakeAnthropic, text, tool_use

TURN_TIMEOUT_S = 60.0
LOG_TIMEOUT_S = 30.0
API_KEY = "sk-ant-api03-" + uuid.uuid4().hex + uuid.uuid4().hex
# The services a turn with a write tool crosses, by the name of their log file.
TURN_SERVICES = ("gateway", "orchestrator1", "tools1", "proposals")


@pytest.fixture(scope="module")
def json_stack(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    redis_url: str,
    run_id: str,
    internal_token: str,
) -> Iterator[tuple[Stack, FakeAnthropic, sessionmaker[Session]]]:
    var = tmp_path_factory.mktemp("json-log-stack")
    database_url = database_for(request, var, "jsonlog")
    engine = make_engine(database_url)
    fake = FakeAnthropic().start()
    stack = Stack(
        StackConfig(
            var_dir=var,
            redis_url=redis_url,
            database_url=database_url,
            internal_token=internal_token,
            redis_prefix=f"sbtest-{run_id}:jsonlog:",
            extra_env={
                "ANTHROPIC_API_KEY": API_KEY,
                "ANTHROPIC_BASE_URL": fake.url,
                "SIGNALBOX_LOG_FORMAT": "json",
                "SIGNALBOX_LOG_LEVEL": "INFO",
                "SIGNALBOX_TOKEN_COUNTING": "estimate",
            },
        )
    )
    stack.start()
    try:
        yield stack, fake, make_session_factory(engine)
    finally:
        stack.stop()
        fake.stop()
        engine.dispose()


def _lines(child: Child) -> list[str]:
    """What the service wrote (not the supervisor's start marker)."""
    return [
        line
        for line in child.log_path.read_text(errors="replace").splitlines()
        if line.strip() and not line.startswith("--- ")
    ]


def _entries(child: Child) -> list[dict[str, Any]]:
    entries = []
    for line in _lines(child):
        try:
            entries.append(json.loads(line))
        except ValueError:
            pytest.fail(f"{child.name}: not a JSON line: {line!r}")
    return entries


def _has_turn(child: Child, turn_id: str) -> Callable[[], bool]:
    def check() -> bool:
        return any(e.get("turn_id") == turn_id for e in _entries(child))

    return check


def _events_until(socket: WebSocket, done: Callable[[Event], bool]) -> list[Event]:
    seen: list[Event] = []
    deadline = time.monotonic() + TURN_TIMEOUT_S
    while not (seen and done(seen[-1])):
        seen.append(socket.next_event(timeout_s=max(0.1, deadline - time.monotonic())))
    return seen


def test_a_turns_lines_in_every_service_are_json_carry_its_id_and_no_secret(
    json_stack: tuple[Stack, FakeAnthropic, sessionmaker[Session]], internal_token: str
) -> None:
    stack, fake, sessions = json_stack
    with sessions() as session:
        user, token = create_user(session, f"user-{uuid.uuid4().hex[:8]}")
        session.commit()
        user_id = user.id
    (stack.config.workspaces_root / user_id / "default").mkdir(parents=True)
    fake.script(
        [
            [text("Writing it."), tool_use("write_file", {"path": "hi.txt", "content": "hi\n"})],
            [text("Proposed.")],
        ]
    )

    with Client(stack.gateway_url, token) as http:
        # A browser's way in: a ticket in the handshake's query string, which uvicorn logs.
        ticket = http.ws_ticket().ticket
        ws_url = stack.gateway_url.replace("http://", "ws://")
        with connect(f"{ws_url}/ws?ticket={ticket}") as browser:
            browser.send(json.dumps({"type": "ping", "req": "r1"}))
            assert json.loads(browser.recv(timeout=10))["type"] == "pong"

        with WebSocket(stack.gateway_url, token) as socket:
            ack = socket.start_turn("write hi.txt")
            events = _events_until(
                socket, lambda e: e.kind == "turn_finished" and e.turn_id == ack.turn_id
            )
        assert events[-1].data["status"] == "completed", events[-1]
        (created,) = [e for e in events if e.kind == "proposal_created"]
        assert http.approve(created.data["proposal_id"]).status == "applied"

    children = {name: stack.children[name] for name in TURN_SERVICES}
    for name, child in children.items():
        wait_until(_has_turn(child, ack.turn_id), LOG_TIMEOUT_S, f"{name} logs the turn id")

    turn_lines = {
        name: [e for e in _entries(child) if e.get("turn_id") == ack.turn_id]
        for name, child in children.items()
    }
    for name, entries in turn_lines.items():
        assert all(e["service"] == name.rstrip("1") for e in entries), name
        assert all(e.get("conversation_id") == ack.conversation_id for e in entries), name
    assert any(e.get("call_id") for e in turn_lines["tools1"]), "no tool call line"
    assert any(e.get("user_id") == user_id for e in turn_lines["orchestrator1"])
    approved = [e for e in turn_lines["proposals"] if "approved" in e["message"]]
    assert approved, "the decision is not logged with the turn's id"

    secrets = {"user token": token, "ticket": ticket, "internal token": internal_token}
    secrets["API key"] = API_KEY
    for child in stack.children.values():
        entries = _entries(child)  # every service's every line is JSON
        assert entries, f"{child.name} logged nothing"
        whole = child.log_path.read_text(errors="replace")
        for what, value in secrets.items():
            assert value not in whole, f"the {what} is in {child.name}'s log"
    handshakes = [e for e in _entries(stack.children["gateway"]) if "/ws?ticket=" in e["message"]]
    assert handshakes and all("ticket=[redacted]" in e["message"] for e in handshakes)
