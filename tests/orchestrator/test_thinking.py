"""Extended thinking on the real SDK against the fake Messages API: requested with the
agent's budget, streamed as ``thinking_delta``, kept with signatures and sent back unchanged."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from signalbox.services.orchestrator.anthropic_model import AnthropicModel
from signalbox.shared.db.models import Message, ModelRequest
from tests.fake_anthropic import (
    FakeAnthropic,
    redacted_thinking,
    sign,
    stream_error,
    text,
    thinking,
    thinking_problems,
    tool_use,
)

from .bound_agents import bind_agent
from .support import Harness, ok, spec


def _real_model(h: Harness, fake: FakeAnthropic) -> None:
    h.runtime.model = AnthropicModel("sk-test", fake.url, "claude-test", retry_backoff_s=0)


def test_thinking_blocks_stream_and_go_back_unchanged_before_the_tool_use(
    harness: Harness, fake_anthropic: FakeAnthropic
) -> None:
    h = harness
    _real_model(h, fake_anthropic)
    bind_agent(h, thinking_budget_tokens=2048, max_output_tokens=1000)
    h.catalogue(spec("read_file"))
    h.dispatcher.tools["read_file"] = ok("contents")
    fake_anthropic.script(
        [
            [
                thinking("The user wants a.txt; I should read it."),
                redacted_thinking(),
                text("Reading."),
                tool_use("read_file", {"path": "a.txt"}),
            ],
            [thinking("It says contents."), text("It says: contents.")],
            [thinking("A thank-you needs no tool."), text("You are welcome.")],
        ]
    )
    first, second = h.turn("what is in a.txt?", seq=1), h.turn("thanks", seq=2)

    assert h.run(first) == "completed"
    assert h.run(second) == "completed"

    assert fake_anthropic.violations == []
    bodies = [r.body for r in fake_anthropic.requests]
    for body in bodies:
        assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
        assert body["max_tokens"] == 3048  # the output limit on top of the budget
    sent = bodies[1]["messages"][1]["content"]
    assert [b["type"] for b in sent] == ["thinking", "redacted_thinking", "text", "tool_use"]
    assert sent[0]["thinking"] == "The user wants a.txt; I should read it."
    assert sent[0]["signature"] == sign(sent[0]["thinking"])
    assert bodies[1]["messages"][2]["content"][0]["type"] == "tool_result"
    # A later turn carries the earlier steps' blocks unchanged too.
    assert bodies[2]["messages"][1]["content"][:2] == sent[:2]
    streamed = "".join(d["text"] for d in h.data("thinking_delta"))
    assert streamed == (
        "The user wants a.txt; I should read it.It says contents.A thank-you needs no tool."
    )
    kinds = h.kinds()
    assert kinds.index("thinking_delta") < kinds.index("text_delta")
    with h.sessions() as s:
        stored = s.scalars(
            select(Message.content)
            .where(Message.turn_id == first, Message.role == "assistant")
            .order_by(Message.seq)  # the first step's (without an order, any step's on PG)
        ).first()
    assert stored is not None and stored[:2] == sent[:2]


def test_a_broken_stream_discards_its_thinking_and_its_attempt_is_billed(
    harness: Harness, fake_anthropic: FakeAnthropic
) -> None:
    h = harness
    _real_model(h, fake_anthropic)
    bind_agent(h, thinking_budget_tokens=1024, max_output_tokens=500)
    h.catalogue(spec("read_file"))
    h.dispatcher.tools["read_file"] = ok("contents")
    fake_anthropic.script(
        [
            [thinking("first try"), stream_error()],
            [thinking("second try"), tool_use("read_file", {"path": "a.txt"})],
            [thinking("done"), text("It says: contents.")],
        ]
    )
    turn_id = h.turn("what is in a.txt?")

    assert h.run(turn_id) == "completed"

    assert fake_anthropic.violations == []
    sent = fake_anthropic.requests[2].body["messages"][1]["content"]
    assert [b.get("thinking") for b in sent if b["type"] == "thinking"] == ["second try"]
    with h.sessions() as s:
        rows = s.execute(
            select(ModelRequest.purpose, ModelRequest.outcome, ModelRequest.input_tokens)
            .where(ModelRequest.turn_id == turn_id)
            .order_by(ModelRequest.id)
        ).all()
    assert [(p, o) for p, o, _ in rows] == [("step", "retried"), ("step", "ok"), ("step", "ok")]
    assert rows[0][2] == fake_anthropic.requests[0].usage["input_tokens"]


def test_the_fake_refuses_thinking_altered_or_out_of_place_as_the_api_does() -> None:
    block: dict[str, Any] = {"type": "thinking", "thinking": "plan", "signature": sign("plan")}
    use: dict[str, Any] = {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "x"}
    on = {"type": "enabled", "budget_tokens": 1024}

    def body(*assistant: dict[str, Any], thinking: object = on) -> dict[str, Any]:
        return {
            "max_tokens": 2048,
            "thinking": thinking,
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": list(assistant)},
                {"role": "user", "content": [result]},
            ],
        }

    assert thinking_problems(body(block, use)) == []
    assert thinking_problems(body({**block, "thinking": "plan!"}, use))
    assert thinking_problems(body(use, block))
    assert thinking_problems(body(use))  # thinking on, the continued tool_use has none
    assert thinking_problems(body(block, use, thinking={"type": "enabled", "budget_tokens": 4096}))


def test_the_demo_model_thinks_when_the_agent_has_a_budget() -> None:
    from signalbox.services.orchestrator.demo_model import DemoModel
    from signalbox.services.orchestrator.model import (
        ModelRequest,
        TextDelta,
        ThinkingBlock,
        ThinkingDelta,
    )

    ask = [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]
    thinks = list(DemoModel().stream(ModelRequest("", ask, thinking_budget_tokens=1024)))
    plain = list(DemoModel().stream(ModelRequest("", ask)))

    kinds = [type(e) for e in thinks]
    assert kinds.index(ThinkingDelta) < kinds.index(ThinkingBlock) < kinds.index(TextDelta)
    [block] = [e.block for e in thinks if isinstance(e, ThinkingBlock)]
    streamed = "".join(e.text for e in thinks if isinstance(e, ThinkingDelta))
    assert block["type"] == "thinking" and block["thinking"] == streamed and block["signature"]
    assert not any(isinstance(e, ThinkingDelta | ThinkingBlock) for e in plain)
