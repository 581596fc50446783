"""The AG-UI mapping (services/gateway/agui.py) as a pure function: Signalbox events in,
AG-UI events out, and a RunAgentInput read into the turn it asks for."""

from __future__ import annotations

import json
from typing import Any

import pytest
from ag_ui.core import BaseEvent, RunAgentInput
from ag_ui.encoder import EventEncoder

from signalbox.services.gateway.agui import RunMapping, map_event, run_started, turn_request
from signalbox.services.gateway.errors import BadInput
from signalbox.shared.events import Event
from signalbox.shared.protocol import MAX_TURN_TEXT_CHARS

TURN = "turn_1"
USAGE = {
    "input_tokens": 10,
    "output_tokens": 5,
    "cache_creation_input_tokens": 3,
    "cache_read_input_tokens": 7,
    "cost_usd": None,
}


def _event(kind: str, data: dict[str, Any], turn_id: str | None = TURN, n: int = 0) -> Event:
    return Event(
        conversation_id="conv_1", id=f"1-{n}", turn_id=turn_id, ts="t", kind=kind, data=data
    )


def _run(events: list[Event]) -> tuple[RunMapping, list[dict[str, Any]]]:
    """Every event through ``map_event``; the AG-UI events as the wire has them (camelCase)."""
    run = RunMapping(thread_id="conv_1", run_id="run_1", turn_id=TURN)
    out: list[BaseEvent] = [run_started(run)]
    for event in events:
        run, mapped = map_event(run, event)
        out += mapped
    encoder = EventEncoder()
    return run, [json.loads(encoder.encode(e).removeprefix("data: ")) for e in out]


def _types(wire: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in wire]


def _finished(status: str = "completed", error: str | None = None) -> Event:
    return _event("turn_finished", {"status": status, "steps": 2, "usage": USAGE, "error": error})


def test_text_deltas_stream_as_one_message_and_tool_calls_hang_under_it() -> None:
    run, wire = _run(
        [
            _event("turn_started", {"model": "m"}),
            _event("text_delta", {"text": "Let me "}),
            _event("text_delta", {"text": ""}),
            _event("text_delta", {"text": "look"}),
            _event("assistant_message", {"text": "Let me look"}),
            _event(
                "tool_call_started",
                {"call_id": "c1", "tool": "list_dir", "input": {"path": "."}, "timeout_s": 5},
            ),
            _event(
                "tool_call_finished",
                {
                    "call_id": "c1",
                    "tool": "list_dir",
                    "status": "ok",
                    "output": "a.txt",
                    "error": None,
                    "duration_ms": 3,
                },
            ),
            _event("assistant_message", {"text": "Done."}),
            _finished(),
        ]
    )
    assert _types(wire) == [
        "RUN_STARTED",
        "CUSTOM",  # signalbox.turn_started
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
        "CUSTOM",  # signalbox.tool_call_finished: status, duration
        "TEXT_MESSAGE_START",  # a step whose text came whole
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]
    assert wire[0] == {"type": "RUN_STARTED", "threadId": "conv_1", "runId": "run_1"}
    first_id = wire[2]["messageId"]
    assert [e["delta"] for e in wire[3:5]] == ["Let me ", "look"]
    assert wire[6] == {
        "type": "TOOL_CALL_START",
        "toolCallId": "c1",
        "toolCallName": "list_dir",
        "parentMessageId": first_id,
    }
    assert json.loads(wire[7]["delta"]) == {"path": "."}
    assert wire[9]["content"] == "a.txt" and wire[9]["toolCallId"] == "c1"
    assert wire[11]["messageId"] != first_id
    assert wire[12]["delta"] == "Done."
    assert wire[-1]["outcome"] == {"type": "success"}
    assert wire[-1]["result"] == {"turn_id": TURN, "status": "completed", "steps": 2}
    assert wire[-1]["usage"] == [
        {"model": "m", "inputTokens": 20, "outputTokens": 5, "totalTokens": 25,
         "cachedInputTokens": 7, "cacheWriteInputTokens": 3},
    ]  # fmt: skip
    assert run.finished and run.open_message_id is None


def test_approvals_and_questions_arrive_as_custom_events_with_what_answers_them() -> None:
    _, wire = _run(
        [
            _event(
                "tool_call_needs_decision",
                {
                    "call_id": "c2",
                    "tool": "run_python",
                    "input": {"code": "1"},
                    "expires_at": "2030-01-01T00:00:00.000Z",
                },
            ),
            _event("tool_call_decided", {"call_id": "c2", "decision": "allow"}),
            _event(
                "tool_call_started",
                {"call_id": "c2", "tool": "run_python", "input": {"code": "1"}, "timeout_s": 5},
            ),
            _event("question", {"question_id": "c3", "text": "Which?", "options": ["a", "b"]}),
            _event("question_answered", {"question_id": "c3"}),
            _event(
                "proposal_created",
                {"proposal_id": "p1", "summary": "s", "files": [], "parent_id": None},
            ),
            _event("proposal_resolved", {"proposal_id": "p1", "status": "applied"}),
        ]
    )
    customs = {e["name"]: e["value"] for e in wire if e["type"] == "CUSTOM"}
    assert set(customs) == {
        "signalbox.tool_call_needs_decision",
        "signalbox.tool_call_decided",
        "signalbox.question",
        "signalbox.question_answered",
        "signalbox.proposal_created",
        "signalbox.proposal_resolved",
    }
    assert customs["signalbox.tool_call_needs_decision"]["call_id"] == "c2"
    assert customs["signalbox.tool_call_needs_decision"]["expires_at"].startswith("2030")
    assert customs["signalbox.question"]["options"] == ["a", "b"]
    assert customs["signalbox.proposal_created"]["proposal_id"] == "p1"
    assert customs["signalbox.question"]["turn_id"] == TURN
    # The call waiting for approval is shown once, although it is started again after it.
    assert _types(wire).count("TOOL_CALL_START") == 1


def test_a_call_refused_before_it_started_still_opens_and_closes_before_its_result() -> None:
    _, wire = _run(
        [
            _event(
                "tool_call_finished",
                {
                    "call_id": "c4",
                    "tool": "rm",
                    "status": "denied",
                    "output": "",
                    "error": "expired: nobody decided",
                    "duration_ms": 0,
                },
            ),
        ]
    )
    assert _types(wire)[1:4] == ["TOOL_CALL_START", "TOOL_CALL_END", "TOOL_CALL_RESULT"]
    assert wire[3]["content"] == "[denied] expired: nobody decided"


@pytest.mark.parametrize(
    ("status", "error", "expected"),
    [
        ("failed", "model said no", ("RUN_ERROR", "failed", "model said no")),
        ("step_limit", None, ("RUN_ERROR", "step_limit", "the turn ended step_limit")),
        ("timed_out", None, ("RUN_ERROR", "timed_out", "the turn ended timed_out")),
    ],
)
def test_a_failed_turn_ends_the_run_with_run_error(
    status: str, error: str | None, expected: tuple[str, str, str]
) -> None:
    _, wire = _run([_event("text_delta", {"text": "half"}), _finished(status, error)])
    assert _types(wire)[-2:] == ["TEXT_MESSAGE_END", "RUN_ERROR"]  # the message is closed first
    assert (wire[-1]["type"], wire[-1]["code"], wire[-1]["message"]) == expected


def test_a_cancelled_turn_finishes_the_run_with_the_cancelled_outcome() -> None:
    _, wire = _run([_finished("cancelled")])
    assert wire[-1]["type"] == "RUN_FINISHED" and wire[-1]["outcome"] == {"type": "cancelled"}


def test_a_resumed_turn_closes_the_message_its_dead_runner_left_open() -> None:
    run, wire = _run(
        [
            _event("text_delta", {"text": "par"}),
            _event("turn_resumed", {"step": 1}),
            _event("text_delta", {"text": "again"}),
        ]
    )
    assert _types(wire) == [
        "RUN_STARTED",
        "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END",
        "CUSTOM",
        "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT",
    ]  # fmt: skip
    assert wire[1]["messageId"] != wire[5]["messageId"] == run.open_message_id


def test_other_turns_conversation_events_and_anything_after_the_end_map_to_nothing() -> None:
    _, wire = _run(
        [
            _event("conversation_created", {"workspace": "default", "title": "t"}),
            _event("turn_queued", {"text": "hi", "client_turn_id": "run_1"}),
            _event("text_delta", {"text": "another turn"}, turn_id="turn_2"),
            _event("text_delta", {"text": "a sub-agent", "parent_call_id": "c"}, turn_id="turn_3"),
            _finished(),
            _event("text_delta", {"text": "late"}),
        ]
    )
    assert _types(wire) == ["RUN_STARTED", "RUN_FINISHED"]


def _input(**fields: Any) -> RunAgentInput:
    body: dict[str, Any] = {
        "threadId": "conv_1",
        "runId": "run_1",
        "messages": [
            {"id": "a", "role": "assistant", "content": "earlier"},
            {"id": "u", "role": "user", "content": "look around"},
        ],
    }
    body.update(fields)
    return RunAgentInput.model_validate(body)


def test_the_last_user_message_becomes_the_turn() -> None:
    request = turn_request(_input(tools=[], context=[], state={}, forwardedProps={}))
    assert (request.conversation_id, request.run_id, request.text) == (
        "conv_1",
        "run_1",
        "look around",
    )
    parts = [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    assert turn_request(_input(messages=[{"id": "u", "role": "user", "content": parts}])).text == (
        "one\ntwo"
    )


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"threadId": "../conv"}, "threadId"),
        ({"threadId": "c" * 41}, "threadId"),
        ({"runId": ""}, "runId"),
        ({"runId": "r" * 201}, "runId"),
        ({"runId": "r\x00"}, "runId"),
        ({"tools": [{"name": "t", "description": "d", "parameters": {}}]}, "tools"),
        ({"resume": [{"interruptId": "i", "status": "resolved"}]}, "resume"),
        ({"messages": []}, "messages"),
        ({"messages": [{"id": "a", "role": "assistant", "content": "x"}]}, "messages"),
        ({"messages": [{"id": "u", "role": "user", "content": ""}]}, "messages"),
        ({"messages": [{"id": "u", "role": "user", "content": "a\x00b"}]}, "messages"),
        (
            {"messages": [{"id": "u", "role": "user", "content": "x" * (MAX_TURN_TEXT_CHARS + 1)}]},
            "messages",
        ),
        (
            {
                "messages": [
                    {
                        "id": "u",
                        "role": "user",
                        "content": [
                            {"type": "image", "source": {"type": "url", "value": "http://x/i.png"}}
                        ],
                    }
                ]
            },
            "image",
        ),
    ],
)
def test_an_input_it_cannot_run_is_refused_naming_the_field(
    fields: dict[str, Any], named: str
) -> None:
    with pytest.raises(BadInput, match=named):
        turn_request(_input(**fields))
