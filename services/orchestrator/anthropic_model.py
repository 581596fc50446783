"""The real model: the Anthropic Messages API, streamed, through the ``anthropic`` SDK.

HTTP-level failures (429, 5xx, 529, connection errors before the stream starts) are retried
by the SDK itself (``max_retries``, honouring ``retry-after``). A stream that breaks after it
started (an SSE ``error`` event such as ``overloaded_error``, a dropped connection) is retried
here, as a whole step, up to ``STEP_RETRIES`` times; the loop is told with ``StepRetry``.

The events are the SDK's own typed stream (``messages.create(stream=True)``), read as they
come: text and thinking deltas are passed on, a ``tool_use`` block's JSON is joined and
parsed once at its ``content_block_stop``, and a ``thinking`` block is assembled the way the
SDK's ``MessageStream`` assembles it (its deltas' text joined, its ``signature_delta`` kept
as sent; a ``redacted_thinking`` block as it started), so it goes back to the API byte for
byte. ``MessageStream`` itself is not used: on every event it rebuilds a snapshot of the
whole message, re-parsing a tool call's partial JSON from its start at each delta, which
cost more CPU than the rest of the step (a step of four tool calls: about 15 ms of CPU
with it, 10 ms without, measured on the fake Messages API).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import anthropic
import httpx2

from signalbox.services.orchestrator import prompt_cache
from signalbox.services.orchestrator.model import (
    ModelError,
    ModelEvent,
    ModelRequest,
    PromptTooLong,
    StepEnd,
    StepRetry,
    TextDelta,
    ThinkingBlock,
    ThinkingDelta,
    ToolUse,
)

log = logging.getLogger(__name__)

SDK_MAX_RETRIES = 4  # HTTP 429/5xx/529 before a stream starts; the SDK backs off between them
STEP_RETRIES = 2  # a stream that broke mid-way is started again at most this many times
STEP_RETRY_BACKOFF_S = 1.0  # times the attempt number; an overloaded API needs a moment
REQUEST_TIMEOUT_S = 600.0  # one streamed step; long answers stream for minutes
# The SDK's own variable: set (to anything), the SDK reads it and its siblings itself.
SDK_SPANS_VARIABLE = "ANTHROPIC_OPEN_TELEMETRY"
THINKING_BLOCKS = frozenset({"thinking", "redacted_thinking"})
PROMPT_TOO_LONG = "prompt is too long"  # the API's 400 message past the context window


def unset_if_empty(value: str | None) -> str | None:
    """``None`` for an unset or empty setting (an empty env var means "not configured")."""
    return value if value and value.strip() else None


def sdk_spans() -> Literal[False] | None:
    """The client's ``open_telemetry`` option: off (``False``) unless the SDK's own
    ``ANTHROPIC_OPEN_TELEMETRY`` is set, which the SDK then reads (``None``).

    Each model request has its GenAI span already, ``chat <model>`` (``spans.py``), with
    the step's usage. The SDK's ``anthropic.messages.create`` span, on by default, carries
    the same ``gen_ai.usage.*`` attributes, so a backend summing them counted every request
    twice; and the SDK built its attributes from the whole request body on every call,
    tracing or not (a no-op tracer still gets a span started): about 4% of an
    orchestrator's CPU in the ``load`` benchmark.
    """
    return None if SDK_SPANS_VARIABLE in os.environ else False


class _BrokenStream(Exception):
    """The stream failed after it started; the step may be retried."""

    def __init__(self, message: str, billed: StepEnd | None = None) -> None:
        super().__init__(message)
        self.billed = billed  # what the attempt reported before it broke


@dataclass
class _Block:
    kind: str
    tool_id: str = ""
    tool_name: str = ""
    json_parts: list[str] = field(default_factory=list)  # a tool_use's input, as it streams
    thinking_parts: list[str] = field(default_factory=list)
    signature: str = ""
    data: str = ""  # a redacted_thinking block's opaque payload

    def thinking_block(self) -> dict[str, Any]:
        """The finished thinking block, as the API is to be sent it back."""
        if self.kind == "redacted_thinking":
            return {"type": "redacted_thinking", "data": self.data}
        return {
            "type": "thinking",
            "thinking": "".join(self.thinking_parts),
            "signature": self.signature,
        }


class AnthropicModel:
    """``Model`` on the Messages API (Claude, a proxy, or any compatible server)."""

    def __init__(
        self,
        api_key: str,
        base_url: str | None = None,
        model: str = "claude-sonnet-4-5",
        *,
        max_retries: int = SDK_MAX_RETRIES,
        step_retries: int = STEP_RETRIES,
        retry_backoff_s: float = STEP_RETRY_BACKOFF_S,
        timeout_s: float = REQUEST_TIMEOUT_S,
        cache_ttl: prompt_cache.CacheTtl | None = "5m",
    ) -> None:
        self._model = model
        self._cache_ttl = cache_ttl  # None: no cache_control at all (the benchmark's baseline)
        self._step_retries = step_retries
        self._retry_backoff_s = retry_backoff_s
        self.client = anthropic.Anthropic(
            api_key=api_key,
            base_url=unset_if_empty(base_url),
            max_retries=max_retries,
            timeout=timeout_s,
            open_telemetry=sdk_spans(),
        )

    @property
    def name(self) -> str:
        """The configured model name."""
        return self._model

    def stream(self, request: ModelRequest) -> Iterator[ModelEvent]:
        """Stream one step, starting it again (``StepRetry``) when the stream breaks."""
        attempt = 0
        while True:
            try:
                yield from self._one_attempt(request)
                return
            except _BrokenStream as exc:
                attempt += 1
                if attempt > self._step_retries:
                    raise ModelError(
                        f"model stream failed {attempt} times, last: {exc}"
                    ) from exc.__cause__
                log.warning("model stream broke (%s); retrying the step, attempt %d", exc, attempt)
                billed = exc.billed or StepEnd(None, 0, 0)
                yield StepRetry(
                    attempt,
                    str(exc),
                    billed.input_tokens,
                    billed.output_tokens,
                    billed.cache_creation_input_tokens,
                    billed.cache_read_input_tokens,
                    billed.model,
                )
                if self._retry_backoff_s > 0:
                    time.sleep(self._retry_backoff_s * attempt)

    def _open(self, request: ModelRequest) -> Any:
        kwargs: dict[str, Any] = {
            "model": request.model or self._model,
            "max_tokens": request.max_tokens,
            "messages": request.messages,
            "stream": True,
        }
        tools = [
            {"name": t.name, "description": t.description, "input_schema": t.input_schema}
            for t in request.tools
        ]
        prompt = prompt_cache.mark(request.system, tools, request.messages, self._cache_ttl)
        kwargs["messages"] = prompt.messages
        if prompt.system:
            kwargs["system"] = prompt.system
        if prompt.tools:
            kwargs["tools"] = prompt.tools
        if request.thinking_budget_tokens is not None:
            kwargs["thinking"] = {
                "type": "enabled",
                "budget_tokens": request.thinking_budget_tokens,
            }
        try:
            return self.client.messages.create(**kwargs)
        except anthropic.APIStatusError as exc:
            why = f"model API answered {exc.status_code}: {exc.message}"
            if exc.status_code == 400 and PROMPT_TOO_LONG in str(exc.message):
                raise PromptTooLong(why) from exc
            raise ModelError(why) from exc
        except anthropic.APIError as exc:
            raise ModelError(f"model API unreachable: {exc}") from exc

    def _one_attempt(self, request: ModelRequest) -> Iterator[ModelEvent]:
        stream = self._open(request)
        blocks: dict[int, _Block] = {}
        input_tokens = output_tokens = cache_written = cache_read = 0
        answered_by = ""
        stop_reason: str | None = None
        stopped = False

        def billed() -> StepEnd:
            return StepEnd(
                None, input_tokens, output_tokens, cache_written, cache_read, answered_by
            )

        try:
            with stream:
                for event in stream:
                    kind = event.type
                    if kind == "message_start":
                        usage = event.message.usage
                        answered_by = str(event.message.model or "")
                        input_tokens = usage.input_tokens or 0
                        output_tokens = usage.output_tokens or 0
                        cache_written = usage.cache_creation_input_tokens or 0
                        cache_read = usage.cache_read_input_tokens or 0
                    elif kind == "content_block_start":
                        block = event.content_block
                        if block.type == "tool_use":
                            blocks[event.index] = _Block("tool_use", block.id, block.name)
                        elif block.type == "thinking":
                            blocks[event.index] = _Block(
                                "thinking",
                                thinking_parts=[block.thinking] if block.thinking else [],
                                signature=block.signature or "",
                            )
                        elif block.type == "redacted_thinking":
                            blocks[event.index] = _Block("redacted_thinking", data=block.data)
                        else:
                            blocks[event.index] = _Block(block.type)
                    elif kind == "content_block_delta":
                        delta = event.delta
                        open_block = blocks.get(event.index)
                        if delta.type == "text_delta":
                            yield TextDelta(delta.text)
                        elif delta.type == "thinking_delta":
                            if open_block is not None:
                                open_block.thinking_parts.append(delta.thinking)
                            yield ThinkingDelta(delta.thinking)
                        elif delta.type == "signature_delta" and open_block is not None:
                            open_block.signature = delta.signature  # as the SDK keeps it
                        elif delta.type == "input_json_delta" and open_block is not None:
                            open_block.json_parts.append(delta.partial_json)
                    elif kind == "content_block_stop":
                        done = blocks.get(event.index)
                        if done is not None and done.kind == "tool_use":
                            yield ToolUse(done.tool_id, done.tool_name, _tool_input(done))
                        elif done is not None and done.kind in THINKING_BLOCKS:
                            yield ThinkingBlock(done.thinking_block())
                    elif kind == "message_delta":
                        stop_reason = event.delta.stop_reason or stop_reason
                        if event.usage.input_tokens is not None:
                            input_tokens = event.usage.input_tokens
                        output_tokens = event.usage.output_tokens
                        # Cumulative when present (newer API versions send them here too).
                        if event.usage.cache_creation_input_tokens is not None:
                            cache_written = event.usage.cache_creation_input_tokens
                        if event.usage.cache_read_input_tokens is not None:
                            cache_read = event.usage.cache_read_input_tokens
                    elif kind == "message_stop":
                        # Read on to the end of the body rather than return here: a response
                        # read to its end hands its connection back to the SDK's pool, so the
                        # next step reuses it instead of opening (and TLS-handshaking) anew.
                        stopped = True
        except anthropic.APIError as exc:
            if not stopped:
                raise _BrokenStream(_describe(exc), billed()) from exc
        except httpx2.HTTPError as exc:
            if not stopped:
                raise _BrokenStream(f"connection broke mid-stream: {exc!r}", billed()) from exc
        except ValueError as exc:  # an event the SDK could not parse
            raise ModelError(f"the model's answer could not be read: {exc}") from exc
        if not stopped:
            raise _BrokenStream("stream ended without message_stop", billed())
        yield StepEnd(
            stop_reason, input_tokens, output_tokens, cache_written, cache_read, answered_by
        )


def _tool_input(block: _Block) -> dict[str, Any]:
    raw = "".join(block.json_parts)
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ModelError(f"tool_use {block.tool_name!r} has invalid JSON input: {raw!r}") from exc
    if not isinstance(value, dict):
        raise ModelError(f"tool_use {block.tool_name!r} input is not an object, got {value!r}")
    return cast(dict[str, Any], value)


def _describe(exc: anthropic.APIError) -> str:
    body = exc.body
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            return f"{err.get('type', 'error')}: {err.get('message', '')}"
    return str(exc.message)
