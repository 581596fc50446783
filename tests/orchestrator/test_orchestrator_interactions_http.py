"""The parked-turn interactions over HTTP instead of frames: answer a question, declare client
tools on a turn and return one's result. The in-process loop on real Redis and SQL; every
request goes to a real gateway (uvicorn on a real port) with httpx."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from signalbox.shared.settings import GatewaySettings
from tests import http_calls
from tests.gateway.conftest import LiveGateway

from .support import Harness, say, use

EDITOR_TOOL = {
    "name": "editor_selection",
    "description": "the text selected in the user's editor",
    "input_schema": {"type": "object"},
    "timeout_s": 30,
}


@pytest.fixture
def http(harness: Harness, internal_token: str, tmp_path: Path) -> Iterator[httpx.Client]:
    """The harness user's HTTP client of a real gateway on the harness's Redis prefix."""
    settings = GatewaySettings(
        redis_url=harness.runtime.settings.redis_url,
        redis_prefix=harness.runtime.keys.prefix,
        database_url=harness.runtime.settings.database_url,
        internal_token=internal_token,
        workspaces_root=tmp_path,
    )
    gateway = LiveGateway(settings)
    gateway.start()
    try:
        headers = {"Authorization": f"Bearer {harness.token}"}
        with http_calls.Client(base_url=gateway.url, headers=headers) as client:
            yield client
    finally:
        gateway.stop()


def test_a_question_answered_over_http_resumes_the_turn_once(
    harness: Harness, http: httpx.Client
) -> None:
    h = harness
    h.model.steps = [say("Let me ask.", use("ask_user", question="Tabs or spaces?")), say("Ok.")]
    turn_id = h.turn("format the code")
    assert h.run(turn_id) == "parked"
    [question] = h.data("question")
    url = f"/api/questions/{question['question_id']}/answer"

    reply = http.post(url, json={"text": "spaces"})
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"question_id": question["question_id"], "turn_id": turn_id}
    again = http.post(url, json={"text": "tabs"})
    assert (again.status_code, again.json()["code"]) == (409, "conflict")
    assert h.data("question_answered") == [{"question_id": question["question_id"]}]
    assert h.run(turn_id) == "completed"
    assert [(c.status, c.output) for c in h.calls(turn_id)] == [("ok", "spaces")]


def test_bad_answers_are_4xx_before_anything_is_recorded(
    harness: Harness, http: httpx.Client
) -> None:
    h = harness
    h.model.steps = [say("Asking.", use("ask_user", question="Name?")), say("Ok.")]
    turn_id = h.turn("go")
    assert h.run(turn_id) == "parked"
    [question] = h.data("question")
    url = f"/api/questions/{question['question_id']}/answer"
    assert http.post(url, json={"text": "a\x00b"}).status_code == 422
    assert http.post(url, json={"text": "x" * 100_001}).status_code == 422
    assert http.post(url, json={}).status_code == 422
    assert http.post("/api/questions/call_nope/answer", json={"text": "a"}).status_code == 404
    assert h.data("question_answered") == []
    anonymous = http_calls.post(f"{http.base_url}{url}", json={"text": "a"})
    assert anonymous.status_code == 401


def test_client_tools_declared_over_http_and_answered_with_the_token(
    harness: Harness, http: httpx.Client
) -> None:
    h = harness
    h.model.steps = [say("Checking.", use("editor_selection")), say("You selected foo().")]
    created = http.post(
        f"/api/conversations/{h.conversation_id}/turns",
        json={"text": "what did I select?", "client_tools": [EDITOR_TOOL]},
    )
    assert created.status_code == 202, created.text
    turn_id = created.json()["turn_id"]

    assert h.run(turn_id) == "parked"
    assert "editor_selection" in {t.name for t in h.model.requests[0].tools}
    [started] = h.data("tool_call_started")
    assert started["executor"] == "client" and started["timeout_s"] == 30
    url = f"/api/tool-calls/{started['call_id']}/result"
    body = {"output": "foo()", "is_error": False}

    wrong = http.post(url, json={**body, "token": started["token"] + "x"})
    assert (wrong.status_code, wrong.json()["code"]) == (404, "not_found")
    right = http.post(url, json={**body, "token": started["token"]})
    assert right.status_code == 200, right.text
    assert right.json() == {"call_id": started["call_id"], "turn_id": turn_id}
    reused = http.post(url, json={**body, "token": started["token"]})
    assert reused.status_code == 404

    assert h.run(turn_id) == "completed"
    [finished] = h.data("tool_call_finished")
    assert (finished["status"], finished["output"]) == ("ok", "foo()")


def test_client_tools_over_http_keep_the_frame_s_limits(
    harness: Harness, http: httpx.Client
) -> None:
    url = f"/api/conversations/{harness.conversation_id}/turns"
    for tools in (
        [{**EDITOR_TOOL, "name": "bad name"}],
        [{**EDITOR_TOOL, "description": "x" * 10_001}],
        [{**EDITOR_TOOL, "input_schema": {"a": ["\x00"]}}],
        [{**EDITOR_TOOL, "timeout_s": 0}],
        [{**EDITOR_TOOL, "name": f"t{i}"} for i in range(65)],
    ):
        reply = http.post(url, json={"text": "hi", "client_tools": tools})
        assert reply.status_code == 422, tools
    assert harness.data("turn_queued") == []
