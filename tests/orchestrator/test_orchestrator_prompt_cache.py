"""Prompt caching: every request marks tools, system and a rolling breakpoint, so each step
reads from the Messages API's cache what the previous one wrote (the fake honours
``cache_control`` by the API's rules: ``tests/fake_prompt_cache.py``)."""

from __future__ import annotations

import itertools
from typing import Any

from signalbox.services.orchestrator.anthropic_model import AnthropicModel
from signalbox.services.orchestrator.demo_model import DemoModel
from signalbox.services.orchestrator.model import ModelRequest, StepEnd, ToolDef
from signalbox.services.orchestrator.prompt_cache import MAX_BREAKPOINTS, mark
from tests.fake_anthropic import FakeAnthropic, RecordedRequest, text, tool_use
from tests.fake_prompt_cache import breakpoints, count_tokens

from .support import Harness, ok, spec

# Long enough that tools + system pass the minimum cacheable prefix (1,024 proxy tokens).
LONG_SYSTEM = "You are Signalbox, a careful agent. " + " ".join(
    f"Rule {i}: read before you change anything." for i in range(200)
)


def _real_model(h: Harness, fake: FakeAnthropic, system: str = LONG_SYSTEM) -> None:
    h.runtime.model = AnthropicModel("sk-test", fake.url, "claude-test", retry_backoff_s=0)
    h.runtime.settings = h.runtime.settings.model_copy(
        update={"system_prompt": system, "max_steps": 10}
    )
    h.catalogue(spec("read_file", side_effect="read"), spec("list_dir", side_effect="read"))
    h.dispatcher.tools.update({"read_file": ok("contents " * 50), "list_dir": ok("a.txt")})


def _turn_script(i: int) -> list[Any]:
    return [
        [text(f"Reading for turn {i}."), tool_use("read_file", {"path": f"f{i}.txt"})],
        [text(f"Answer {i}.")],
    ]


def test_a_20_turn_conversation_reads_every_earlier_prefix_from_the_cache(
    harness: Harness, fake_anthropic: FakeAnthropic
) -> None:
    h = harness
    _real_model(h, fake_anthropic)
    for i in range(20):
        fake_anthropic.script(_turn_script(i))
        assert h.run(h.turn(f"question {i}", seq=i + 1)) == "completed"

    sent = fake_anthropic.requests
    assert len(sent) == 40 and fake_anthropic.violations == []
    assert all(breakpoints(r.body) <= MAX_BREAKPOINTS for r in sent)
    first = sent[0].usage
    assert first["cache_read_input_tokens"] == 0
    assert first["cache_creation_input_tokens"] == count_tokens(sent[0].body)
    for previous, request in itertools.pairwise(sent):
        # The whole previous prompt is read back; only what this step added is new.
        assert request.usage["cache_read_input_tokens"] == count_tokens(previous.body)
        assert request.usage["input_tokens"] == 0
        assert sum(request.usage.values()) == count_tokens(request.body)
    billed = sum(_billed(r) for r in sent)
    uncached = sum(count_tokens(r.body) for r in sent)
    assert uncached / billed >= 5


def _billed(request: RecordedRequest) -> float:
    u = request.usage
    return (
        u["input_tokens"]
        + 1.25 * u["cache_creation_input_tokens"]
        + 0.1 * u["cache_read_input_tokens"]
    )


def test_a_changed_system_prompt_invalidates_the_cached_prefix(
    harness: Harness, fake_anthropic: FakeAnthropic
) -> None:
    h = harness
    _real_model(h, fake_anthropic)
    fake_anthropic.script(_turn_script(0))
    assert h.run(h.turn("question 0", seq=1)) == "completed"
    h.runtime.settings = h.runtime.settings.model_copy(
        update={"system_prompt": LONG_SYSTEM.replace("careful", "cautious")}
    )
    fake_anthropic.script(_turn_script(1))

    assert h.run(h.turn("question 1", seq=2)) == "completed"

    changed, after = fake_anthropic.requests[2:]
    # Tools alone are under the minimum, so nothing before the system prompt was cached.
    assert changed.usage["cache_read_input_tokens"] == 0
    assert changed.usage["cache_creation_input_tokens"] == count_tokens(changed.body)
    assert after.usage["cache_read_input_tokens"] == count_tokens(changed.body)


def test_many_parallel_results_still_read_the_previous_prefix(
    harness: Harness, fake_anthropic: FakeAnthropic
) -> None:
    """25 tool results is more than the API's 20-block lookback from the last block: the
    breakpoint on the previous request's end still finds it."""
    h = harness
    _real_model(h, fake_anthropic)
    calls = [tool_use("list_dir", {"path": f"d{i}"}) for i in range(25)]
    fake_anthropic.script([[text("Listing."), *calls], [text("Done.")]])

    assert h.run(h.turn("list everything", seq=1)) == "completed"

    first, second = fake_anthropic.requests
    assert breakpoints(second.body) == MAX_BREAKPOINTS
    assert second.usage["cache_read_input_tokens"] == count_tokens(first.body)


def test_a_sub_agents_steps_are_cached_too(harness: Harness, fake_anthropic: FakeAnthropic) -> None:
    h = harness
    _real_model(h, fake_anthropic)
    fake_anthropic.script(
        [
            [text("Delegating."), tool_use("spawn_agent", {"task": "find the entry point"})],
            [text("Reading."), tool_use("read_file", {"path": "main.py"})],
            [text("main() in main.py.")],
            [text("The sub-agent says: main().")],
        ]
    )

    assert h.run(h.turn("where does it start?", seq=1)) == "completed"

    parent_first, child_first, child_second, parent_last = fake_anthropic.requests
    assert all(breakpoints(r.body) <= MAX_BREAKPOINTS for r in fake_anthropic.requests)
    assert child_second.usage["cache_read_input_tokens"] == count_tokens(child_first.body)
    assert parent_last.usage["cache_read_input_tokens"] == count_tokens(parent_first.body)


def test_the_cache_expires_after_its_ttl(harness: Harness, fake_anthropic: FakeAnthropic) -> None:
    h = harness
    _real_model(h, fake_anthropic)
    now = [1000.0]
    fake_anthropic.cache.clock = lambda: now[0]
    fake_anthropic.script(_turn_script(0))
    assert h.run(h.turn("question 0", seq=1)) == "completed"
    now[0] += 301  # past the 5-minute TTL
    fake_anthropic.script(_turn_script(1))

    assert h.run(h.turn("question 1", seq=2)) == "completed"

    assert fake_anthropic.requests[2].usage["cache_read_input_tokens"] == 0


def test_marking_copies_the_transcript_and_never_exceeds_the_limit() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "text", "text": "hello"}]},
        {"role": "user", "content": [{"type": "text", "text": "again"}]},
    ]
    tools = [{"name": "a"}, {"name": "b"}]
    before = repr(messages), repr(tools)

    prompt = mark("sys", tools, messages, "1h")

    assert (repr(messages), repr(tools)) == before, "the caller's transcript is untouched"
    assert prompt.breakpoints() == 4
    assert prompt.tools[-1]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    assert prompt.messages[0]["content"][-1]["cache_control"]["ttl"] == "1h"
    assert prompt.messages[2]["content"][-1]["cache_control"]["ttl"] == "1h"
    assert "cache_control" not in prompt.messages[1]["content"][-1]
    assert mark("sys", tools, messages, None).breakpoints() == 0


def test_the_offline_demo_model_reports_cache_reads_like_the_api() -> None:
    model = DemoModel()
    tools = [ToolDef("list_dir", "lists the workspace", {"type": "object"})]
    hello: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    later = [
        *hello,
        {"role": "assistant", "content": [{"type": "text", "text": "hello"}]},
        {"role": "user", "content": [{"type": "text", "text": "again"}]},
    ]

    [first] = [e for e in model.stream(ModelRequest(LONG_SYSTEM, hello, tools)) if _end(e)]
    [second] = [e for e in model.stream(ModelRequest(LONG_SYSTEM, later, tools)) if _end(e)]

    assert isinstance(first, StepEnd) and isinstance(second, StepEnd)
    assert first.cache_read_input_tokens == 0 and first.cache_creation_input_tokens > 0
    assert second.cache_read_input_tokens == first.cache_creation_input_tokens
    assert second.cache_creation_input_tokens > 0, "what the step added is written"


def _end(event: object) -> bool:
    return isinstance(event, StepEnd)
