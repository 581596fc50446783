"""The transcript builder: every tool_use the model sees has exactly one tool_result, in order."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from signalbox.services.orchestrator.transcript import (
    FINAL_CALL_STATUSES,
    OPEN_CALL_STATUSES,
    build_messages,
)
from tests.fake_anthropic import transcript_problems


@dataclass
class Msg:
    id: str
    role: str
    content: list[Any]


@dataclass
class Call:
    message_id: str
    position: int
    tool_use_id: str
    tool: str
    status: str
    output: str | None
    error: str | None
    timeout_s: float = 5.0
    id: str = ""


STATUSES = sorted(FINAL_CALL_STATUSES | OPEN_CALL_STATUSES)

# A conversation: turns of (user text, steps); a step is (text, statuses of its calls).
steps = st.lists(
    st.tuples(st.sampled_from(["", "thinking"]), st.lists(st.sampled_from(STATUSES), max_size=4)),
    max_size=4,
)
conversations = st.lists(st.tuples(st.text(min_size=1, max_size=5), steps), min_size=1, max_size=4)


def _rows(
    conversation: list[tuple[str, list[tuple[str, list[str]]]]],
) -> tuple[list[Msg], dict[str, list[Call]]]:
    messages: list[Msg] = []
    calls: dict[str, list[Call]] = {}
    for t, (text, turn_steps) in enumerate(conversation):
        messages.append(Msg(f"u{t}", "user", [{"type": "text", "text": text}]))
        for s, (say, statuses) in enumerate(turn_steps):
            mid = f"a{t}.{s}"
            content: list[Any] = [{"type": "text", "text": say}] if say else []
            rows = []
            for p, status in enumerate(statuses):
                use_id = f"toolu_{t}_{s}_{p}"
                content.append({"type": "tool_use", "id": use_id, "name": "t", "input": {"p": p}})
                rows.append(Call(mid, p, use_id, "t", status, f"out{p}", None))
            messages.append(Msg(mid, "assistant", content))
            calls[mid] = list(reversed(rows))  # the builder must order them itself
    return messages, calls


@settings(max_examples=300, deadline=None)
@given(conversations)
def test_every_tool_use_has_exactly_one_result_in_order(conversation: Any) -> None:
    rows, calls = _rows(conversation)

    out = build_messages(rows, calls)

    assert transcript_problems(out) == []
    finished = [c for cs in calls.values() for c in cs if c.status in FINAL_CALL_STATUSES]
    unfinished = [c for cs in calls.values() for c in cs if c.status in OPEN_CALL_STATUSES]
    uses = [b["id"] for m in out for b in m["content"] if b.get("type") == "tool_use"]
    results = [b for m in out for b in m["content"] if b.get("type") == "tool_result"]
    assert sorted(uses) == sorted(c.tool_use_id for c in finished)
    assert [r["tool_use_id"] for r in results] == uses, "results follow their uses, in order"
    dumped = json.dumps(out)
    assert all(c.tool_use_id not in dumped for c in unfinished), "unfinished calls are hidden"
    by_id = {c.tool_use_id: c for c in finished}
    for r in results:
        assert r["content"], "every result says something"
        assert r.get("is_error", False) == (by_id[r["tool_use_id"]].status != "ok")


def test_statuses_are_explained_to_the_model() -> None:
    rows = [
        Msg("u", "user", [{"type": "text", "text": "go"}]),
        Msg(
            "a",
            "assistant",
            [{"type": "tool_use", "id": f"x{i}", "name": "t", "input": {}} for i in range(4)],
        ),
    ]
    calls = {
        "a": [
            Call("a", 0, "x0", "t", "timeout", "", None, timeout_s=2),
            Call("a", 1, "x1", "t", "lost", "", None),
            Call("a", 2, "x2", "t", "error", "", "boom"),
            Call("a", 3, "x3", "t", "ok", "", None),
        ]
    }

    results = build_messages(rows, calls)[-1]["content"]

    texts = [r["content"] for r in results]
    assert "timed out after 2 s" in texts[0]
    assert "vanished" in texts[1]
    assert texts[2] == "error: boom"
    assert texts[3] == "(no output)"
