"""spawn_agent: a read-only child turn run inline, its events tagged with the parent call, its
final answer the call's result; and the context budget as the loop applies it."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from signalbox.shared.db.models import Message, ToolCall, Turn
from tests.fake_anthropic import transcript_problems

from .support import Harness, ok, say, spec, use


def _turns(h: Harness) -> list[Turn]:
    with h.sessions() as s:
        return list(s.scalars(select(Turn).where(Turn.conversation_id == h.conversation_id)))


def _call(h: Harness, call_id: str) -> ToolCall:
    with h.sessions() as s:
        call = s.get(ToolCall, call_id)
        assert call is not None
        return call


def test_a_sub_agent_runs_read_only_and_its_answer_is_the_result(harness: Harness) -> None:
    h = harness
    h.catalogue(spec("read_file", side_effect="read"), spec("write_file", side_effect="propose"))
    h.dispatcher.tools["read_file"] = ok("def main(): ...")
    spawn = use("spawn_agent", task="find the entry point")
    h.model.steps = [
        say("Delegating.", spawn),
        say("Reading.", use("read_file", path="main.py"), use("write_file", path="x")),
        say("The entry point is main() in main.py."),
        say("The sub-agent says: main()."),
    ]
    turn_id = h.turn("where does it start?")

    assert h.run(turn_id) == "completed"

    _parent, child_first, child_second, parent_last = h.model.requests
    assert {t.name for t in child_first.tools} == {"read_file"}, "read-only tools alone"
    assert child_first.messages == [
        {"role": "user", "content": [{"type": "text", "text": "find the entry point"}]}
    ]
    assert transcript_problems(child_second.messages) == []
    # The parent sees its call's result, never the child's own messages.
    assert transcript_problems(parent_last.messages) == []
    assert [m["role"] for m in parent_last.messages] == ["user", "assistant", "user"]
    [result] = [b for b in parent_last.messages[-1]["content"] if b["type"] == "tool_result"]
    assert result["content"] == "The entry point is main() in main.py."
    assert result["tool_use_id"] == spawn.id

    [child] = [t for t in _turns(h) if t.parent_call_id is not None]
    assert child.status == "completed" and child.text == "find the entry point"
    call = _call(h, child.parent_call_id or "")
    assert (call.turn_id, call.status, call.tool) == (turn_id, "ok", "spawn_agent")
    events = h.events()
    child_events = [e for e in events if e.turn_id == child.id]
    assert child_events and all(e.data["parent_call_id"] == call.id for e in child_events)
    assert (child_events[0].kind, child_events[-1].kind) == ("turn_started", "turn_finished")
    child_calls = {
        d["tool"]: d["status"]
        for d in (e.data for e in child_events)
        if "status" in d and "tool" in d
    }
    assert child_calls == {"read_file": "ok", "write_file": "error"}
    parent_events = [e for e in events if e.turn_id == turn_id]
    assert not any("parent_call_id" in e.data for e in parent_events)
    assert parent_events[-1].kind == "turn_finished"
    assert parent_events[-1].data["status"] == "completed"
    # say() reports 10 input / 5 output tokens a step: two parent steps, two child steps.
    parent_usage, child_usage = parent_events[-1].data["usage"], child_events[-1].data["usage"]
    assert (parent_usage["input_tokens"], parent_usage["output_tokens"]) == (40, 20)
    assert (child_usage["input_tokens"], child_usage["output_tokens"]) == (20, 10)
    assert (parent_usage["cost_usd"], child_usage["cost_usd"]) == (0.00028, 0.00014)


def test_a_sub_agent_past_its_step_limit_is_an_error_result(harness: Harness) -> None:
    h = harness
    h.runtime.settings = h.runtime.settings.model_copy(update={"subagent_max_steps": 2})
    h.catalogue(spec("list_dir"))
    h.dispatcher.tools["list_dir"] = ok()
    h.model.steps = [
        say("Delegating.", use("spawn_agent", task="look forever")),
        say("again", use("list_dir")),
        say("and again", use("list_dir")),
        say("The sub-agent got nowhere."),
    ]
    turn_id = h.turn("go")

    assert h.run(turn_id) == "completed"

    with h.sessions() as s:
        call = s.scalars(
            select(ToolCall).where(ToolCall.turn_id == turn_id, ToolCall.tool == "spawn_agent")
        ).one()
    assert call.status == "error"
    assert "step_limit" in (call.error or "") and call.output == "and again"


def test_big_tool_outputs_reach_the_model_cut_and_oldest_shortened_first(
    harness: Harness,
) -> None:
    h = harness
    h.runtime.settings = h.runtime.settings.model_copy(
        update={"tool_output_max_chars": 4000, "context_tokens": 2500}
    )
    h.catalogue(spec("read_file"))
    h.dispatcher.tools["read_file"] = ok("x" * 9000)
    h.model.steps = [
        say("One.", use("read_file", path="a")),
        say("Two.", use("read_file", path="b")),
        say("Three.", use("read_file", path="c")),
        say("Done."),
    ]
    turn_id = h.turn("read three big files")

    assert h.run(turn_id) == "completed"

    def results(request_index: int) -> list[str]:
        messages: list[dict[str, Any]] = h.model.requests[request_index].messages
        assert transcript_problems(messages) == []
        return [
            b["content"] for m in messages for b in m["content"] if b.get("type") == "tool_result"
        ]

    first = results(1)
    assert len(first) == 1 and "output truncated: 4000 of 9000 characters shown" in first[0]
    last = results(3)
    assert len(last) == 3, "every call keeps its result"
    assert "shortened to fit the context budget" in last[0]
    assert "shortened" not in last[2], "the newest output is shortened last"
    with h.sessions() as s:  # the stored transcript is untouched
        stored = s.scalars(select(ToolCall).where(ToolCall.turn_id == turn_id)).all()
        assert all(len(c.output or "") == 9000 for c in stored)
        assert s.scalars(select(Message).where(Message.turn_id == turn_id)).all()
