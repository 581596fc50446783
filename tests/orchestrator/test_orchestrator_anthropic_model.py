"""``AnthropicModel``: the real SDK against the fake Messages API server (real HTTP, real SSE)."""

from __future__ import annotations

import pytest

from signalbox.services.orchestrator.anthropic_model import AnthropicModel
from signalbox.services.orchestrator.model import (
    ModelError,
    ModelEvent,
    ModelRequest,
    StepEnd,
    StepRetry,
    TextDelta,
    ToolDef,
    ToolUse,
)
from tests.fake_anthropic import (
    FakeAnthropic,
    http_error,
    reply,
    stream_error,
    text,
    tool_use,
)

REQUEST = ModelRequest(
    system="be brief",
    messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    tools=[ToolDef("read_file", "reads a file", {"type": "object"})],
    max_tokens=100,
    model="claude-test",
)


def _model(fake: FakeAnthropic, **kw: float) -> AnthropicModel:
    return AnthropicModel("sk-test-key", fake.url, "claude-test", retry_backoff_s=0, **kw)  # type: ignore[arg-type]


def test_text_deltas_tool_use_from_split_json_and_usage(fake_anthropic: FakeAnthropic) -> None:
    tricky = {"path": 'dir/ünïcode "quoted".txt', "lines": [1, 2, {"deep": None}]}
    fake_anthropic.script(
        [
            reply(
                text("Let me read that file.", chunks=4),
                tool_use("read_file", tricky, id="toolu_1", splits=[1, 2, 9, 10, 17, 33]),
                tool_use("read_file", {}, id="toolu_2"),
                input_tokens=123,
                output_tokens=45,
            )
        ]
    )

    events = list(_model(fake_anthropic).stream(REQUEST))

    deltas = [e.text for e in events if isinstance(e, TextDelta)]
    assert len(deltas) == 4 and "".join(deltas) == "Let me read that file."
    assert [e for e in events if isinstance(e, ToolUse)] == [
        ToolUse("toolu_1", "read_file", tricky),
        ToolUse("toolu_2", "read_file", {}),
    ]
    assert events[-1] == StepEnd("tool_use", 123, 45, 0, 0, "claude-test")  # under the minimum
    [sent] = fake_anthropic.requests
    credentials = {sent.headers.get("x-api-key"), sent.headers.get("authorization")}
    assert credentials & {"sk-test-key", "Bearer sk-test-key"}
    assert sent.body["stream"] is True
    marker = {"type": "ephemeral", "ttl": "5m"}  # prompt caching: tools, system, last block
    assert sent.body["system"] == [{"type": "text", "text": "be brief", "cache_control": marker}]
    assert sent.body["model"] == "claude-test"
    assert sent.body["tools"] == [
        {
            "name": "read_file",
            "description": "reads a file",
            "input_schema": {"type": "object"},
            "cache_control": marker,
        }
    ]


def test_a_429_is_retried_after_its_retry_after(fake_anthropic: FakeAnthropic) -> None:
    fake_anthropic.script([http_error(429, retry_after=0.4), [text("ok")]])

    events = list(_model(fake_anthropic).stream(REQUEST))

    assert isinstance(events[-1], StepEnd)
    first, second = fake_anthropic.requests
    assert second.at - first.at >= 0.35, "retry-after was not honoured"
    assert second.headers.get("x-stainless-retry-count") == "1"


def test_an_overloaded_529_is_retried_by_the_sdk(fake_anthropic: FakeAnthropic) -> None:
    fake_anthropic.script([http_error(529, "overloaded_error", retry_after=0.01), [text("fine")]])

    events = list(_model(fake_anthropic).stream(REQUEST))

    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "fine"
    assert len(fake_anthropic.requests) == 2


def test_a_client_error_fails_at_once(fake_anthropic: FakeAnthropic) -> None:
    fake_anthropic.script([http_error(400, "invalid_request_error", "bad tools")])

    with pytest.raises(ModelError, match="400"):
        list(_model(fake_anthropic).stream(REQUEST))
    assert len(fake_anthropic.requests) == 1


def test_a_mid_stream_error_restarts_the_step(fake_anthropic: FakeAnthropic) -> None:
    fake_anthropic.script([[text("partial answ"), stream_error()], [text("whole answer")]])

    events: list[ModelEvent] = list(_model(fake_anthropic).stream(REQUEST))

    retry_at = next(i for i, e in enumerate(events) if isinstance(e, StepRetry))
    assert isinstance(events[retry_at], StepRetry)
    assert "overloaded_error" in events[retry_at].error  # type: ignore[union-attr]
    after = "".join(e.text for e in events[retry_at:] if isinstance(e, TextDelta))
    assert after == "whole answer"
    assert isinstance(events[-1], StepEnd)


def test_mid_stream_errors_beyond_the_bound_fail(fake_anthropic: FakeAnthropic) -> None:
    fake_anthropic.script([[text("a"), stream_error("api_error", "Internal")] for _ in range(5)])

    events: list[ModelEvent] = []
    with pytest.raises(ModelError, match="3 times"):
        for event in _model(fake_anthropic).stream(REQUEST):
            events.append(event)
    assert sum(isinstance(e, StepRetry) for e in events) == 2
    assert len(fake_anthropic.requests) == 3


def test_consecutive_steps_reuse_one_connection(fake_anthropic: FakeAnthropic) -> None:
    # Each step's response is read to its end, so the SDK's pool keeps the connection
    # (against the real API, a new connection per step would cost a TLS handshake).
    fake_anthropic.script([[text("one"), tool_use("read_file", {})], [text("two")], [text("3")]])
    model = _model(fake_anthropic)

    for _ in range(3):
        events = list(model.stream(REQUEST))
        assert isinstance(events[-1], StepEnd)

    peers = {r.peer for r in fake_anthropic.requests}
    assert len(fake_anthropic.requests) == 3 and len(peers) == 1, peers


@pytest.mark.parametrize(
    ("variable", "enabled"),
    [(None, False), ("true", True), ("false", False)],
)
def test_the_sdks_own_spans_are_off_unless_its_variable_asks(
    fake_anthropic: FakeAnthropic,
    monkeypatch: pytest.MonkeyPatch,
    variable: str | None,
    enabled: bool,
) -> None:
    # Each request has its GenAI span already (``chat <model>``); the SDK's would count its
    # usage twice. Set, the SDK's own variable is the SDK's to read.
    if variable is None:
        monkeypatch.delenv("ANTHROPIC_OPEN_TELEMETRY", raising=False)
    else:
        monkeypatch.setenv("ANTHROPIC_OPEN_TELEMETRY", variable)
    assert _model(fake_anthropic).client.open_telemetry["traces"]["enabled"] is enabled
