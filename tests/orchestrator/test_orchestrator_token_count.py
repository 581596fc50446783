"""Exact token counts for the context budget: ``messages.count_tokens`` through the SDK, each
content block counted once and kept, the estimate when the API cannot count."""

from __future__ import annotations

import json
from typing import Any

from signalbox.services.orchestrator.anthropic_model import AnthropicModel
from signalbox.services.orchestrator.context_budget import (
    REQUEST_FRAMING_TOKENS,
    estimate_tokens,
    fit,
    surely_fits,
)
from signalbox.services.orchestrator.token_count import ApiTokenCounter
from signalbox.shared.tool_contract import ToolCallRequest, ToolResult
from tests.fake_anthropic import FakeAnthropic, text, tool_use
from tests.fake_prompt_cache import proxy_tokens

from .support import Harness, ok, spec


def _counter(fake: FakeAnthropic) -> ApiTokenCounter:
    model = AnthropicModel("sk-test", fake.url, "claude-test", retry_backoff_s=0)
    return ApiTokenCounter(model.client, "claude-test")


def _counted_texts(fake: FakeAnthropic) -> list[str]:
    return [
        block["text"]
        for request in fake.count_requests
        for message in request.body["messages"]
        for block in message["content"]
    ]


def test_a_block_is_counted_exactly_by_the_api(fake_anthropic: FakeAnthropic) -> None:
    counter = _counter(fake_anthropic)
    sentence = "Read before you change anything, then propose."

    assert counter.count(sentence) == proxy_tokens(sentence)
    assert counter.count({"type": "text", "text": sentence}) == counter.count(sentence)
    assert counter.api_calls == 2, "the per-message baseline once, then the block"
    assert counter.count(sentence) == proxy_tokens(sentence)
    assert counter.api_calls == 2, "a block already counted is not asked again"


def _counting(h: Harness, fake: FakeAnthropic) -> Harness:
    """``h`` on the model over HTTP, counting with its API, offering ``read_file``."""
    h.runtime.model = AnthropicModel("sk-test", fake.url, "claude-test", retry_backoff_s=0)
    h.runtime.tokens = _counter(fake)
    h.catalogue(spec("read_file", side_effect="read"))
    h.dispatcher.tools["read_file"] = ok("contents of the file")
    return h


def test_each_block_of_a_conversation_is_counted_once(
    harness: Harness, fake_anthropic: FakeAnthropic
) -> None:
    h = _counting(harness, fake_anthropic)
    # A budget the conversation could exceed (it is far from the default's): counted.
    budget = REQUEST_FRAMING_TOKENS + 100
    h.runtime.settings = h.runtime.settings.model_copy(
        update={"max_steps": 10, "context_tokens": budget}
    )
    for i in range(3):
        fake_anthropic.script(
            [
                [text(f"Reading {i}."), tool_use("read_file", {"path": f"f{i}.txt"})],
                [text(f"Answer {i}.")],
            ]
        )
        assert h.run(h.turn(f"question {i}", seq=i + 1)) == "completed"

    steps = len(fake_anthropic.requests)
    assert steps == 6
    # The baseline once, then at most one request per step: only the blocks new to it.
    assert len(fake_anthropic.count_requests) <= 1 + steps
    counted = [t for t in _counted_texts(fake_anthropic) if t != "."]
    assert len(counted) == len(set(counted)), "no block is counted twice"
    assert "question 2" in counted and h.runtime.settings.system_prompt in counted


def test_a_turn_that_surely_fits_its_budget_asks_for_no_count(
    harness: Harness, fake_anthropic: FakeAnthropic
) -> None:
    h = _counting(harness, fake_anthropic)
    fake_anthropic.script(
        [[text("Reading."), tool_use("read_file", {"path": "f.txt"})], [text("Answer.")]]
    )

    assert h.run(h.turn("question", seq=1)) == "completed"

    assert len(fake_anthropic.requests) == 2
    assert fake_anthropic.count_requests == [], "a few hundred bytes in a 150,000-token budget"


def test_tools_that_fill_the_budget_are_counted_at_every_step(
    harness: Harness, fake_anthropic: FakeAnthropic
) -> None:
    # The messages alone are a few hundred bytes; the tool's schema, measured once while
    # it stays the same, holds 6,000: the request may not fit, so it is counted.
    h = _counting(harness, fake_anthropic)
    schema = {"type": "object", "description": "a wide schema " * 430}
    h.catalogue(spec("read_file", side_effect="read").model_copy(update={"input_schema": schema}))
    budget = REQUEST_FRAMING_TOKENS + 3_000
    h.runtime.settings = h.runtime.settings.model_copy(update={"context_tokens": budget})
    fake_anthropic.script(
        [[text("Reading."), tool_use("read_file", {"path": "f.txt"})], [text("Answer.")]]
    )

    assert h.run(h.turn("question", seq=1)) == "completed"

    assert len(fake_anthropic.requests) == 2
    counted = [json.dumps(r.body) for r in fake_anthropic.count_requests]
    assert any("a wide schema" in body for body in counted), "the first step is counted"
    assert any("f.txt" in body for body in counted), "so is the second (its new blocks)"


def test_tools_that_grow_during_a_turn_are_measured_again(
    harness: Harness, fake_anthropic: FakeAnthropic
) -> None:
    # Step 1 offers a small tool and surely fits (no count); while its call runs, a worker
    # starts serving a tool whose schema fills the budget: step 2 must be counted.
    h = _counting(harness, fake_anthropic)
    # Step 1's request (the built-in tools, read_file, the question) is about 3,100 bytes.
    budget = REQUEST_FRAMING_TOKENS + 4_500
    h.runtime.settings = h.runtime.settings.model_copy(update={"context_tokens": budget})
    wide = spec("wide_tool", side_effect="read").model_copy(
        update={"input_schema": {"type": "object", "description": "a wide schema " * 430}}
    )
    small = spec("read_file", side_effect="read")

    counted_in_step_1: list[int] = []

    def read_and_grow(request: ToolCallRequest) -> ToolResult:
        counted_in_step_1.append(len(fake_anthropic.count_requests))
        h.catalogue(small, wide)
        return ToolResult(call_id=request.call_id, status="ok", output="contents", duration_ms=1)

    h.dispatcher.tools["read_file"] = read_and_grow
    fake_anthropic.script(
        [[text("Reading."), tool_use("read_file", {"path": "f.txt"})], [text("Answer.")]]
    )

    assert h.run(h.turn("question", seq=1)) == "completed"

    assert len(fake_anthropic.requests) == 2
    assert "wide_tool" not in json.dumps(fake_anthropic.requests[0].body["tools"])
    assert counted_in_step_1 == [0], "step 1 surely fits: no count"
    counted = [json.dumps(r.body) for r in fake_anthropic.count_requests]
    assert counted, "step 2 offers the wide tool: it may not fit, so it is counted"
    assert any("a wide schema" in body for body in counted)


def test_surely_fits_bounds_tokens_by_bytes_not_by_the_estimate() -> None:
    # A token is at least a byte: 3,000 three-byte characters may be up to 9,000 tokens,
    # though the characters / 4 estimate says 750.
    wide = [{"role": "user", "content": [{"type": "text", "text": "語" * 3000}]}]
    size = len(json.dumps(wide, ensure_ascii=False).encode())
    assert estimate_tokens(wide) < 1000 < 9000 < size
    assert not surely_fits(wide, 9000 + REQUEST_FRAMING_TOKENS)
    assert surely_fits(wide, size + REQUEST_FRAMING_TOKENS)
    assert not surely_fits(wide, size + REQUEST_FRAMING_TOKENS - 1)
    # An image costs its pixels, whatever its bytes: never sure.
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}
    assert not surely_fits([{"role": "user", "content": [image]}], 1_000_000)


def test_the_budget_is_kept_by_exact_counts(fake_anthropic: FakeAnthropic) -> None:
    counter = _counter(fake_anthropic)
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "read", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "word " * 2000}],
        },
    ]
    counter.prime([b for m in messages for b in m["content"]])
    exact = sum(counter.count(b) for m in messages for b in m["content"])
    assert exact < estimate_tokens(messages), "the proxy counts a word as one token, not 1.25"

    assert fit(messages, exact, 50_000, count=counter.count) == messages, "it fits exactly"
    shortened = fit(messages, exact - 1, 50_000, count=counter.count)
    assert "shortened to fit" in shortened[2]["content"][0]["content"]


def test_without_the_endpoint_the_estimate_stands_in(fake_anthropic: FakeAnthropic) -> None:
    fake_anthropic.serve_count_tokens = False
    counter = _counter(fake_anthropic)

    assert counter.count("a" * 400) == 100
    calls = counter.api_calls
    assert counter.count("b" * 40) == 10
    assert counter.api_calls == calls, "after a refusal the API is not asked again"
