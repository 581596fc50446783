"""The offline demo model: labelled, deterministic, parallel tools, only live tools."""

from __future__ import annotations

from typing import Any

from signalbox.services.orchestrator.demo_model import DEMO_LABEL, DemoModel
from signalbox.services.orchestrator.model import (
    ModelEvent,
    ModelRequest,
    StepEnd,
    TextDelta,
    ToolDef,
    ToolUse,
)

ALL_TOOLS = [
    ToolDef(name, name, {"type": "object"})
    for name in ("list_dir", "read_file", "search_files", "write_file", "edit_file")
]


def _step(messages: list[dict[str, Any]], tools: list[ToolDef] = ALL_TOOLS) -> list[ModelEvent]:
    return list(DemoModel().stream(ModelRequest(system="s", messages=messages, tools=tools)))


def _text(events: list[ModelEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def _calls(events: list[ModelEvent]) -> list[ToolUse]:
    return [e for e in events if isinstance(e, ToolUse)]


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def _answer(events: list[ModelEvent], outputs: list[str]) -> list[dict[str, Any]]:
    """The assistant message of ``events`` and the user message of its tool results."""
    calls = _calls(events)
    assistant = {
        "role": "assistant",
        "content": [{"type": "text", "text": _text(events)}]
        + [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.input} for c in calls],
    }
    results = {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": c.id, "content": out}
            for c, out in zip(calls, outputs, strict=True)
        ],
    }
    return [assistant, results]


def test_look_around_streams_labelled_text_and_two_parallel_calls() -> None:
    events = _step([_user("please look around")])

    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert len(deltas) >= 3
    assert _text(events).startswith(DEMO_LABEL)
    assert [(c.name, c.input) for c in _calls(events)] == [
        ("list_dir", {"path": "."}),
        ("search_files", {"pattern": "TODO|FIXME"}),
    ]
    end = events[-1]
    assert isinstance(end, StepEnd) and end.stop_reason == "tool_use"
    assert end.input_tokens > 0 and end.output_tokens > 0


def test_look_around_then_write_then_summarise() -> None:
    messages = [_user("look around, then write a file notes.md with Remember the milk")]
    first = _step(messages)
    messages += _answer(first, ["a.txt\nb.txt", "no matches"])

    second = _step(messages)
    assert _text(second).startswith(DEMO_LABEL)
    assert [(c.name, c.input) for c in _calls(second)] == [
        ("write_file", {"path": "notes.md", "content": "Remember the milk\n"})
    ]
    messages += _answer(second, ["proposed, awaiting approval (proposal_id prop_abc123)"])

    final = _step(messages)
    assert _calls(final) == []
    summary = _text(final)
    assert summary.startswith(DEMO_LABEL)
    assert "prop_abc123" in summary and "list_dir: ok" in summary
    assert isinstance(final[-1], StepEnd) and final[-1].stop_reason == "end_turn"


def test_create_defaults_and_edit_parsing() -> None:
    assert [(c.name, c.input["path"]) for c in _calls(_step([_user("create hello.txt")]))] == [
        ("write_file", "hello.txt")
    ]
    assert _calls(_step([_user("add a file please")]))[0].input["path"] == "NOTES.md"
    edit = _calls(_step([_user("change app.py replacing 'x = 1' with 'x = 2'")]))
    assert [(c.name, c.input) for c in edit] == [
        ("edit_file", {"path": "app.py", "old_str": "x = 1", "new_str": "x = 2"})
    ]


def test_only_tools_of_the_live_catalogue_are_called() -> None:
    read_only = [t for t in ALL_TOOLS if t.name in {"list_dir", "search_files"}]
    messages = [_user("look around and create hello.txt")]
    first = _step(messages, read_only)
    assert {c.name for c in _calls(first)} == {"list_dir", "search_files"}
    messages += _answer(first, ["x", "y"])

    final = _step(messages, read_only)
    assert _calls(final) == []
    assert "write_file" in _text(final)  # says what it could not do
    assert _calls(_step([_user("look around")], [])) == []


def test_it_is_deterministic_and_a_new_turn_starts_over() -> None:
    messages = [_user("look around")]
    assert _step(messages) == _step(messages)
    first = _step(messages)
    messages += _answer(first, ["a", "b"])
    messages += [{"role": "assistant", "content": [{"type": "text", "text": "done"}]}]
    messages += [_user("explore again")]
    again = _step(messages)
    assert len(_calls(again)) == 2
    assert {c.id for c in _calls(again)}.isdisjoint({c.id for c in _calls(first)})


def test_without_a_request_it_explains_itself() -> None:
    events = _step([_user("hello")])
    assert _calls(events) == []
    assert _text(events).startswith(DEMO_LABEL) and "look around" in _text(events)
