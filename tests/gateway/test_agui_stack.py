"""``POST /api/agui`` against every service as a real process (the offline demo model): a
turn streams in as AG-UI events, a repeated run replays it, and the attacks on the route
(no token, another user's conversation, bad bodies) are refused before anything is stored."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from signalbox.stack import Stack
from tests import http_calls

TURN_TIMEOUT_S = 60.0
TEXT = "look around and create hello.txt with Hello"


@pytest.fixture
def token(make_stack_user: Callable[[], tuple[str, str]], stack: Stack) -> str:
    return make_stack_user()[1]


def _headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def run_input(conversation_id: str, run_id: str, text: str = TEXT, **extra: Any) -> dict[str, Any]:
    """A RunAgentInput as @ag-ui/client sends it (camelCase, the thread's messages so far)."""
    return {
        "threadId": conversation_id,
        "runId": run_id,
        "state": {},
        "messages": [{"id": f"{run_id}-user", "role": "user", "content": text}],
        "tools": [],
        "context": [],
        "forwardedProps": {},
        **extra,
    }


def new_conversation(url: str, token: str) -> str:
    created = http_calls.post(f"{url}/api/conversations", json={}, headers=_headers(token))
    assert created.status_code == 201, created.text
    conversation_id: str = created.json()["conversation_id"]
    return conversation_id


def run_agui(url: str, token: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """POST the input and read the AG-UI stream to its RUN_FINISHED or RUN_ERROR."""
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + TURN_TIMEOUT_S
    with http_calls.stream(
        "POST", f"{url}/api/agui", json=body, headers=_headers(token), timeout=TURN_TIMEOUT_S
    ) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            assert time.monotonic() < deadline, "the run did not end"
            if line.startswith("data: "):
                events.append(json.loads(line.removeprefix("data: ")))
                if events[-1]["type"] in ("RUN_FINISHED", "RUN_ERROR"):
                    return events
    raise AssertionError(f"the stream ended before the run did: {events}")


def test_a_turn_streams_in_as_agui_events_and_its_proposal_is_approved_over_http(
    stack: Stack, token: str
) -> None:
    url = stack.gateway_url
    conversation_id = new_conversation(url, token)
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    events = run_agui(url, token, run_input(conversation_id, run_id))
    types = [e["type"] for e in events]

    assert events[0] == {"type": "RUN_STARTED", "threadId": conversation_id, "runId": run_id}
    assert types[-1] == "RUN_FINISHED" and events[-1]["outcome"] == {"type": "success"}
    text = "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert "offline demo model" in text and "look around" in text
    assert types.count("TEXT_MESSAGE_START") == types.count("TEXT_MESSAGE_END") >= 2
    started = {e["toolCallId"]: e["toolCallName"] for e in events if e["type"] == "TOOL_CALL_START"}
    assert {"list_dir", "search_files", "write_file"} <= set(started.values())
    results = {e["toolCallId"]: e["content"] for e in events if e["type"] == "TOOL_CALL_RESULT"}
    assert set(results) == set(started)
    [listing] = [results[c] for c, name in started.items() if name == "list_dir"]
    assert isinstance(listing, str)
    customs = {e["name"]: e["value"] for e in events if e["type"] == "CUSTOM"}
    proposal_id = customs["signalbox.proposal_created"]["proposal_id"]
    assert [f["path"] for f in customs["signalbox.proposal_created"]["files"]] == ["hello.txt"]

    # The approval is answered through the proposals route the docs name.
    approved = http_calls.post(
        f"{url}/api/proposals/{proposal_id}/approve", json={}, headers=_headers(token)
    )
    assert approved.status_code == 200, approved.text
    assert approved.json()["status"] == "applied"

    # The same input again (a client retrying) starts no second turn: it replays this one.
    again = run_agui(url, token, run_input(conversation_id, run_id))
    assert [e["type"] for e in again] == types
    detail = http_calls.get(f"{url}/api/conversations/{conversation_id}", headers=_headers(token))
    assert len(detail.json()["turns"]) == 1


def test_without_a_token_or_with_a_wrong_one_the_route_answers_401(
    stack: Stack, token: str
) -> None:
    conversation_id = new_conversation(stack.gateway_url, token)
    body = run_input(conversation_id, "r1")
    for headers in ({}, {"Authorization": "Bearer sbt_wrong"}, {"Authorization": f"Basic {token}"}):
        answer = http_calls.post(f"{stack.gateway_url}/api/agui", json=body, headers=headers)
        assert answer.status_code == 401, answer.text


def test_another_users_conversation_is_404_and_gets_no_turn(
    stack: Stack, token: str, make_stack_user: Callable[[], tuple[str, str]]
) -> None:
    url = stack.gateway_url
    victims = new_conversation(url, token)
    _, attacker = make_stack_user()
    for thread_id in (victims, "conv_doesnotexist"):
        answer = http_calls.post(
            f"{url}/api/agui", json=run_input(thread_id, "r1"), headers=_headers(attacker)
        )
        assert answer.status_code == 404, answer.text
        assert answer.json()["code"] == "not_found"
    detail = http_calls.get(f"{url}/api/conversations/{victims}", headers=_headers(token))
    assert detail.json()["turns"] == []
    events = http_calls.get(f"{url}/api/conversations/{victims}/events", headers=_headers(token))
    assert [e["kind"] for e in events.json()] == ["conversation_created"]


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"threadId": "x", "runId": "r"},  # no messages
        {"threadId": "x", "runId": "r", "messages": [{"id": "u", "role": "nobody"}]},
        "not an object",
    ],
)
def test_a_body_that_is_not_a_run_agent_input_is_422(
    stack: Stack, token: str, body: object
) -> None:
    answer = http_calls.post(f"{stack.gateway_url}/api/agui", json=body, headers=_headers(token))
    assert answer.status_code == 422, answer.text


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"tools": [{"name": "t", "description": "d", "parameters": {}}]}, "tools"),
        ({"threadId": "../../etc"}, "threadId"),
        ({"messages": [{"id": "u", "role": "user", "content": "x\x00"}]}, "messages"),
    ],
)
def test_an_input_it_cannot_run_is_422_naming_the_field_and_stores_nothing(
    stack: Stack, token: str, extra: dict[str, Any], named: str
) -> None:
    url = stack.gateway_url
    conversation_id = new_conversation(url, token)
    body = run_input(conversation_id, "r1") | extra
    answer = http_calls.post(f"{url}/api/agui", json=body, headers=_headers(token))
    assert answer.status_code == 422, answer.text
    assert named in answer.json()["detail"]
    detail = http_calls.get(f"{url}/api/conversations/{conversation_id}", headers=_headers(token))
    assert detail.json()["turns"] == []
