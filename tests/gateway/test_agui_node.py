"""The real AG-UI client, ``HttpAgent`` of ``@ag-ui/client`` from npm, runs a turn on the
whole stack (every service a real process, the offline demo model) from Node: it accepts
the stream (its own checks of event order and shape pass) and sees the text, the tool calls
and their results. ``tests/agui_node/run.mjs`` prints what the client received.

Needs ``node``, ``npm`` and ``tests/agui_node/node_modules`` (``scripts/test`` runs
``npm ci`` there); without them the test skips saying which is missing, and under CI fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from signalbox.stack import Stack
from tests.gateway.test_agui_stack import TEXT, new_conversation

NODE_DIR = Path(__file__).resolve().parents[1] / "agui_node"
RUN_TIMEOUT_S = 90.0


@pytest.fixture(scope="session")  # session: decided before the stack is started
def node() -> str:
    """The ``node`` executable, with @ag-ui/client installed; skip (or fail in CI) without."""
    node, npm = shutil.which("node"), shutil.which("npm")
    missing = None
    if node is None or npm is None:
        missing = "node and npm are not installed"
    elif not (NODE_DIR / "node_modules" / "@ag-ui" / "client").is_dir():
        missing = f"@ag-ui/client is not installed: run `npm ci` in {NODE_DIR}"
    if missing is None:
        assert node is not None
        return node
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the AG-UI client test, but {missing}")
    pytest.skip(missing)


def _run_node(node: str, *args: str) -> tuple[int, list[dict[str, Any]]]:
    done = subprocess.run(
        [node, str(NODE_DIR / "run.mjs"), *args],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env={**os.environ, "SUPPRESS_TRANSFORMATION_WARNINGS": "true"},
    )
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"run.mjs printed nothing; stderr: {done.stderr}"
    return done.returncode, lines


def test_the_real_agui_client_runs_a_turn_and_sees_text_tool_calls_and_results(
    node: str, stack: Stack, make_stack_user: Callable[[], tuple[str, str]]
) -> None:
    _, token = make_stack_user()
    conversation_id = new_conversation(stack.gateway_url, token)
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    code, lines = _run_node(node, stack.gateway_url, token, conversation_id, run_id, TEXT)
    assert code == 0, lines[-1]
    *events, last = lines
    types = [e["type"] for e in events]

    assert types[0] == "RUN_STARTED" and events[0]["runId"] == run_id
    assert types[-1] == "RUN_FINISHED"
    text = "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert "offline demo model" in text
    started = {e["toolCallId"]: e["toolCallName"] for e in events if e["type"] == "TOOL_CALL_START"}
    assert {"list_dir", "search_files", "write_file"} <= set(started.values())
    assert {e["toolCallId"] for e in events if e["type"] == "TOOL_CALL_RESULT"} == set(started)
    names = {e["name"] for e in events if e["type"] == "CUSTOM"}
    assert "signalbox.proposal_created" in names

    # The messages the client assembled: the user's, the assistant's with its tool calls,
    # and one tool message per call carrying its result.
    messages = last["messages"]
    assert messages[0] == {"id": f"{run_id}-user", "role": "user", "content": TEXT}
    calls = {
        call["id"]: json.loads(call["function"]["arguments"])
        for m in messages
        if m["role"] == "assistant"
        for call in m.get("toolCalls", [])
    }
    assert set(calls) == set(started)
    assert {"path": "."} in calls.values()
    tool_results = {m["toolCallId"] for m in messages if m["role"] == "tool"}
    assert tool_results == set(started)
    assert any("offline demo model" in (m.get("content") or "") for m in messages[1:])


def test_the_real_agui_client_reports_a_refused_token_as_an_error(
    node: str, stack: Stack, make_stack_user: Callable[[], tuple[str, str]]
) -> None:
    _, token = make_stack_user()
    conversation_id = new_conversation(stack.gateway_url, token)
    code, lines = _run_node(node, stack.gateway_url, "sbt_wrong", conversation_id, "r1", "hi")
    assert code == 1
    assert "401" in lines[-1]["error"]
