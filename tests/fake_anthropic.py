"""A local fake of the Anthropic Messages API, speaking the real streaming (SSE) format.

Real HTTP on a free port, served from a background thread, so the real ``anthropic`` SDK
talks to it unchanged (``base_url=server.url``). Each test scripts the responses::

    server.script([
        [text("Let me look."), tool_use("read_file", {"path": "a.txt"})],
        [text("done")],
        http_error(429, retry_after=0),
        [text("partial"), stream_error("overloaded_error")],
    ])

One entry is consumed per POST /v1/messages; ``script_for(marker, [...])`` keeps entries
for requests whose messages contain ``marker`` (turns running at once each get theirs), and
``stall()`` holds a stream at that point until the test releases it (a model that hangs
mid-answer, e.g. while the test kills the orchestrator reading it). Every request is
recorded (``server.requests``) and checked like the real API checks it: a transcript where
a ``tool_use`` is not answered by exactly one ``tool_result`` in the next user message gets
HTTP 400, and the problem is kept in ``server.violations``.

Usage is reported the way the real API reports it (``tests/fake_prompt_cache.py``): tokens
counted by a deterministic proxy tokenizer, ``cache_control`` breakpoints honoured (a prefix
written earlier within its TTL is read: ``cache_read_input_tokens``; the part newly marked
is written: ``cache_creation_input_tokens``; the rest is ``input_tokens``), more than four
breakpoints refused. ``POST /v1/messages/count_tokens`` is served too (``count_requests``).

Extended thinking: ``thinking(...)`` streams a ``thinking`` block (``thinking_delta`` then
``signature_delta`` events, as the real API does), its signature an HMAC of its text under
this process's key; ``redacted_thinking()`` a ``redacted_thinking`` block with opaque
``data``. Like the real API, a request whose thinking blocks are altered (signature or data
not the fake's own), out of place (not first in their message), or missing before the
``tool_use`` that a ``tool_result`` continues when thinking is on gets HTTP 400, the problem
kept in ``server.violations``; so does ``budget_tokens`` under 1024 or not below
``max_tokens``. ``context_window_tokens`` (per server) makes a longer prompt a 400
``prompt is too long: N tokens > M maximum`` (not a violation: it is what the API does).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import os
import random
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.fake_prompt_cache import (
    MAX_BREAKPOINTS,
    PromptCache,
    breakpoints,
    count_tokens,
    prompt_blocks,
)

# --- the script -------------------------------------------------------------------------


@dataclass(frozen=True)
class Text:
    """A text block streamed as ``chunks`` text deltas."""

    text: str
    chunks: int = 3


@dataclass(frozen=True)
class ToolUseBlock:
    """A tool_use block whose JSON input is streamed split at ``splits`` positions."""

    name: str
    input: dict[str, Any]
    id: str
    splits: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Thinking:
    """A thinking block streamed as ``chunks`` thinking deltas, then its signature."""

    text: str
    chunks: int = 3


@dataclass(frozen=True)
class RedactedThinking:
    """A redacted_thinking block: opaque ``data`` only the fake can verify."""

    nonce: str


@dataclass(frozen=True)
class StreamError:
    """An SSE ``error`` event at this point of the stream; the stream then ends."""

    type: str = "overloaded_error"
    message: str = "Overloaded"


@dataclass(frozen=True, eq=False)
class Stall:
    """The stream stops here: ``reached`` is set, then it waits for ``release`` (or timeout)."""

    reached: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    timeout_s: float = 60.0


@dataclass(frozen=True)
class HttpError:
    """The whole response is an HTTP error (the SDK retries 429/5xx/529 itself)."""

    status: int
    type: str = "rate_limit_error"
    message: str = "scripted error"
    retry_after: float | None = None


@dataclass(frozen=True)
class Reply:
    """One streamed response: its blocks, stop reason and usage."""

    items: tuple[Text | ToolUseBlock | StreamError | Stall | Thinking | RedactedThinking, ...]
    stop_reason: str | None = None
    input_tokens: int | None = None  # None: as counted and cached from the request
    output_tokens: int = 7


Item = Text | ToolUseBlock | StreamError | Stall | Thinking | RedactedThinking
Scripted = Reply | HttpError | Sequence[Item]

_ids = iter(range(1, 1_000_000))


def text(value: str, chunks: int = 3) -> Text:
    """A text block, streamed as ``chunks`` deltas."""
    return Text(value, chunks)


def tool_use(
    name: str,
    input: dict[str, Any],
    id: str | None = None,
    splits: Sequence[int] | None = None,
) -> ToolUseBlock:
    """A tool_use block; its JSON is split at ``splits`` (default: every 5 characters)."""
    return ToolUseBlock(
        name, input, id or f"toolu_fake{next(_ids):04d}", tuple(splits) if splits else None
    )


_SIGNING_KEY = os.urandom(16)  # this process's: a signature the fake did not make fails


def sign(value: str) -> str:
    """The fake's signature of a thinking block's text (or of a redacted block's nonce)."""
    return hmac.new(_SIGNING_KEY, value.encode(), hashlib.sha256).hexdigest()


def thinking(value: str, chunks: int = 3) -> Thinking:
    """A thinking block, streamed as ``chunks`` deltas and then signed."""
    return Thinking(value, chunks)


def redacted_thinking() -> RedactedThinking:
    """A redacted_thinking block."""
    return RedactedThinking(f"nonce{next(_ids):04d}")


def _redacted_data(nonce: str) -> str:
    return f"{nonce}.{sign('redacted:' + nonce)}"


def stream_error(type: str = "overloaded_error", message: str = "Overloaded") -> StreamError:
    """An ``error`` event mid-stream."""
    return StreamError(type, message)


def stall(timeout_s: float = 60.0) -> Stall:
    """A point where the stream hangs until ``.release.set()``; ``.reached`` tells it got there."""
    return Stall(timeout_s=timeout_s)


def http_error(
    status: int,
    type: str = "rate_limit_error",
    message: str = "scripted error",
    retry_after: float | None = None,
) -> HttpError:
    """An HTTP error response (429 with ``retry_after``, 529 overloaded, 500...)."""
    return HttpError(status, type, message, retry_after)


def reply(
    *items: Item,
    stop_reason: str | None = None,
    input_tokens: int | None = None,
    output_tokens: int = 7,
) -> Reply:
    """A streamed response with explicit usage or stop reason."""
    return Reply(tuple(items), stop_reason, input_tokens, output_tokens)


# --- the transcript check the real API makes --------------------------------------------


def transcript_problems(messages: list[dict[str, Any]]) -> list[str]:
    """What the real API would refuse in ``messages``: unanswered or orphan tool_use/result."""
    problems: list[str] = []
    if not messages or messages[0].get("role") != "user":
        problems.append("the first message must have role 'user'")
    for i, msg in enumerate(messages):
        content = msg.get("content")
        blocks = content if isinstance(content, list) else []
        if i > 0 and msg.get("role") == messages[i - 1].get("role"):
            problems.append(f"messages {i - 1} and {i} have the same role {msg.get('role')!r}")
        if isinstance(content, list) and not content:
            problems.append(f"message {i} has empty content")
        results = [b["tool_use_id"] for b in blocks if b.get("type") == "tool_result"]
        if msg.get("role") == "user" and results:
            prev = messages[i - 1] if i > 0 else {}
            prev_blocks = prev.get("content") if isinstance(prev.get("content"), list) else []
            uses = [b["id"] for b in prev_blocks or [] if b.get("type") == "tool_use"]
            if sorted(results) != sorted(uses) or len(set(results)) != len(results):
                problems.append(f"message {i}: tool_results {results} do not answer {uses}")
            leading = [b.get("type") for b in blocks[: len(results)]]
            if any(t != "tool_result" for t in leading):
                problems.append(f"message {i}: tool_result blocks must come first")
        if msg.get("role") == "assistant":
            uses = [b["id"] for b in blocks if b.get("type") == "tool_use"]
            if uses:
                nxt = messages[i + 1] if i + 1 < len(messages) else None
                nxt_blocks = (nxt or {}).get("content")
                answered = [
                    b["tool_use_id"]
                    for b in (nxt_blocks if isinstance(nxt_blocks, list) else [])
                    if b.get("type") == "tool_result"
                ]
                if nxt is None or sorted(answered) != sorted(uses):
                    problems.append(f"message {i}: tool_use {uses} not answered, got {answered}")
    return problems


THINKING_TYPES = ("thinking", "redacted_thinking")
MIN_THINKING_BUDGET = 1024


def thinking_problems(body: dict[str, Any]) -> list[str]:
    """What the real API would refuse about thinking: blocks altered, out of place, or
    missing where tool use continues with thinking on, and a bad ``thinking`` budget."""
    problems: list[str] = []
    config = body.get("thinking")
    enabled = isinstance(config, dict) and config.get("type") == "enabled"
    if enabled:
        assert isinstance(config, dict)
        budget = config.get("budget_tokens")
        if not isinstance(budget, int) or budget < MIN_THINKING_BUDGET:
            problems.append(f"thinking.budget_tokens: must be >= {MIN_THINKING_BUDGET}")
        elif int(body.get("max_tokens") or 0) <= budget:
            problems.append("`max_tokens` must be greater than `thinking.budget_tokens`")
    messages = body.get("messages") or []
    for i, msg in enumerate(messages):
        content = msg.get("content")
        if msg.get("role") != "assistant" or not isinstance(content, list):
            continue
        seen_other = False
        for block in content:
            kind = block.get("type")
            if kind not in THINKING_TYPES:
                seen_other = True
                continue
            if seen_other:
                problems.append(f"message {i}: a {kind} block must come before other blocks")
            if kind == "thinking":
                extra = set(block) - {"type", "thinking", "signature", "cache_control"}
                if extra or block.get("signature") != sign(str(block.get("thinking"))):
                    problems.append(f"message {i}: Invalid `signature` in `thinking` block")
            else:
                nonce, _, _mac = str(block.get("data")).partition(".")
                if block.get("data") != _redacted_data(nonce):
                    problems.append(f"message {i}: Invalid `data` in `redacted_thinking` block")
    last = next(
        (i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "assistant"),
        None,
    )
    if enabled and last is not None:
        content = messages[last].get("content")
        blocks = content if isinstance(content, list) else []
        continued = any(b.get("type") == "tool_use" for b in blocks) and last < len(messages) - 1
        if continued and (not blocks or blocks[0].get("type") not in THINKING_TYPES):
            first = blocks[0].get("type") if blocks else None
            problems.append(
                f"message {last}: Expected `thinking` or `redacted_thinking`, but found "
                f"{first!r}. When `thinking` is enabled, a final `assistant` message must "
                "start with a thinking block"
            )
    return problems


# --- the attachment blocks the real API checks (image, document) -------------------------

_IMAGE_MAGIC = {
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/gif": (b"GIF87a", b"GIF89a"),
    "image/webp": (b"RIFF",),
}
IMAGE_MAX_BYTES = 5 * 1024 * 1024


def _decoded(data: Any) -> bytes | None:
    if not isinstance(data, str):
        return None
    try:
        return base64.b64decode(data, validate=True)
    except ValueError:
        return None


def _image_problem(where: str, source: dict[str, Any]) -> str | None:
    media_type = source.get("media_type")
    if media_type not in _IMAGE_MAGIC:
        return f"{where}.source.media_type: Input should be {sorted(_IMAGE_MAGIC)}"
    raw = _decoded(source.get("data"))
    if raw is None:
        return f"{where}.source.base64.data: invalid base64 data"
    if len(raw) > IMAGE_MAX_BYTES:
        return f"{where}.source.base64: image exceeds 5 MB maximum"
    if not raw.startswith(_IMAGE_MAGIC[media_type]):
        return f"{where}: Image does not match the provided media type {media_type}"
    return None


def _document_problem(where: str, block: dict[str, Any], source: dict[str, Any]) -> str | None:
    title = block.get("title")
    if title is not None and not isinstance(title, str):
        return f"{where}.title: Input should be a valid string"
    if source.get("type") == "text":
        if source.get("media_type") != "text/plain" or not isinstance(source.get("data"), str):
            return f"{where}.source.text: media_type 'text/plain' and a string data expected"
        return None
    if source.get("media_type") != "application/pdf":
        return f"{where}.source.base64.media_type: Input should be 'application/pdf'"
    raw = _decoded(source.get("data"))
    if raw is None:
        return f"{where}.source.base64.data: invalid base64 data"
    if not raw.startswith(b"%PDF-"):
        return f"{where}: The PDF specified was not valid."
    return None


def attachment_problems(messages: list[dict[str, Any]]) -> list[str]:
    """What the real API would refuse in the ``image``/``document`` blocks of ``messages``."""
    problems: list[str] = []
    for i, msg in enumerate(messages):
        content = msg.get("content")
        for j, block in enumerate(content if isinstance(content, list) else []):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind not in ("image", "document"):
                continue
            where = f"messages.{i}.content.{j}.{kind}"
            if msg.get("role") != "user":
                problems.append(f"{where}: only a user message may carry {kind} blocks")
                continue
            source = block.get("source")
            if not isinstance(source, dict) or source.get("type") not in ("base64", "text"):
                problems.append(f"{where}.source: a base64 (or, for a document, text) source")
                continue
            if kind == "image" and source.get("type") != "base64":
                problems.append(f"{where}.source: an image takes a base64 source")
                continue
            found = (
                _image_problem(where, source)
                if kind == "image"
                else _document_problem(where, block, source)
            )
            if found is not None:
                problems.append(found)
    return problems


def attachment_blocks(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``image`` and ``document`` blocks a request carried, in order (for assertions)."""
    return [
        block
        for msg in body.get("messages") or []
        if isinstance(msg.get("content"), list)
        for block in msg["content"]
        if isinstance(block, dict) and block.get("type") in ("image", "document")
    ]


# --- the server -------------------------------------------------------------------------


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def _split(value: str, parts: int) -> list[str]:
    if parts <= 1 or len(value) <= 1:
        return [value]
    size = max(1, -(-len(value) // parts))
    return [value[i : i + size] for i in range(0, len(value), size)]


def _split_at(value: str, splits: Sequence[int] | None) -> list[str]:
    cuts = sorted({s for s in splits if 0 < s < len(value)}) if splits else []
    if not splits:
        cuts = list(range(5, len(value), 5))
    bounds = [0, *cuts, len(value)]
    return [value[a:b] for a, b in itertools.pairwise(bounds)]


def sse_events(
    item: Reply, message_id: str, model: str, usage: dict[str, int] | None = None
) -> Iterator[bytes | Stall]:
    """The SSE byte frames of one scripted response, exactly as the real API orders them
    (with each ``Stall`` yielded where the stream is to hang); ``usage``: the input side."""
    has_tools = any(isinstance(i, ToolUseBlock) for i in item.items)
    prompt = dict(usage or {"input_tokens": 11})
    if item.input_tokens is not None:
        prompt["input_tokens"] = item.input_tokens
    yield _sse(
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": message_id,
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {**prompt, "output_tokens": 1},
            },
        },
    )
    yield _sse("ping", {"type": "ping"})
    index = -1
    for block in item.items:
        if isinstance(block, Stall):
            yield block
            continue
        index += 1
        if isinstance(block, StreamError):
            yield _sse(
                "error",
                {"type": "error", "error": {"type": block.type, "message": block.message}},
            )
            return
        if isinstance(block, Text):
            start: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [
                {"type": "text_delta", "text": part} for part in _split(block.text, block.chunks)
            ]
        elif isinstance(block, Thinking):
            start = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [
                {"type": "thinking_delta", "thinking": part}
                for part in _split(block.text, block.chunks)
            ]
            deltas.append({"type": "signature_delta", "signature": sign(block.text)})
        elif isinstance(block, RedactedThinking):
            start = {"type": "redacted_thinking", "data": _redacted_data(block.nonce)}
            deltas = []
        else:
            start = {"type": "tool_use", "id": block.id, "name": block.name, "input": {}}
            raw = json.dumps(block.input)
            deltas = [
                {"type": "input_json_delta", "partial_json": part}
                for part in _split_at(raw, block.splits)
            ]
        yield _sse(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": start},
        )
        for delta in deltas:
            yield _sse(
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": delta},
            )
        yield _sse("content_block_stop", {"type": "content_block_stop", "index": index})
    stop_reason = item.stop_reason or ("tool_use" if has_tools else "end_turn")
    yield _sse(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {**prompt, "output_tokens": item.output_tokens},
        },
    )
    yield _sse("message_stop", {"type": "message_stop"})


@dataclass
class RecordedRequest:
    """One request the fake received."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float = 0.0  # time.monotonic() when it arrived
    peer: tuple[str, int] = ("", 0)  # the client's address: one per TCP connection
    usage: dict[str, int] = field(default_factory=dict)  # the input side reported, if served


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client closing its kept-alive connection is normal; anything else is printed."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@dataclass
class FakeAnthropic:
    """The fake server; use as a context manager or ``start()``/``stop()``."""

    host: str = "127.0.0.1"
    seed: int = 1
    # True: each SSE event's bytes go out in chunks of 1 to 64 bytes at random (a real
    # network splits frames anywhere; the parser must not care). False: one write per
    # event, as the real API streams them (the benchmarks).
    split_chunks: bool = True
    requests: list[RecordedRequest] = field(default_factory=list)
    count_requests: list[RecordedRequest] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    cache: PromptCache = field(default_factory=PromptCache)
    serve_count_tokens: bool = True  # False: 404, as from a proxy without the endpoint
    # The model's context window: a longer prompt is a 400 "prompt is too long" (None: none).
    context_window_tokens: int | None = None
    too_long: int = 0  # requests refused as too long
    _queue: list[Scripted] = field(default_factory=list)
    _by_marker: dict[str, list[Scripted]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The base URL to give the SDK."""
        assert self._server is not None, "start() the fake first"
        return f"http://{self.host}:{self._server.server_address[1]}"

    def script(self, responses: Sequence[Scripted]) -> None:
        """Queue responses, one per coming request."""
        with self._lock:
            self._queue.extend(responses)

    def script_for(self, marker: str, responses: Sequence[Scripted]) -> None:
        """Queue responses for the requests whose messages contain ``marker``."""
        with self._lock:
            self._by_marker.setdefault(marker, []).extend(responses)

    @property
    def remaining(self) -> int:
        """Scripted responses not yet served."""
        with self._lock:
            return len(self._queue)

    def _next(
        self,
        body: dict[str, Any],
        path: str,
        headers: dict[str, str],
        peer: tuple[str, int],
    ) -> tuple[Scripted | None, RecordedRequest]:
        record = RecordedRequest(path, headers, body, time.monotonic(), peer)
        with self._lock:
            self.requests.append(record)
            return self._pop(body), record

    def _pop(self, body: dict[str, Any]) -> Scripted | None:
        """The scripted response for ``body`` (the caller holds the lock)."""
        if self._by_marker:
            text = json.dumps(body.get("messages"))
            for marker, queue in self._by_marker.items():
                if queue and marker in text:
                    return queue.pop(0)
        return self._queue.pop(0) if self._queue else None

    def start(self) -> FakeAnthropic:
        """Serve on a free port from a daemon thread."""
        fake = self
        rng = random.Random(self.seed)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # A streaming server writes each event at once (as the real API does); with
            # Nagle's algorithm on, a write behind an unacknowledged one waits for the
            # client's delayed ACK (40 ms) on a kept-alive connection.
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep test output quiet

            def _json(self, status: int, body: dict[str, Any], headers: dict[str, str]) -> None:
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(raw)

            def _error(self, status: int, type: str, message: str, **headers: str) -> None:
                body = {"type": "error", "error": {"type": type, "message": message}}
                self._json(status, body, headers)

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except json.JSONDecodeError:
                    self._error(400, "invalid_request_error", "body is not JSON")
                    return
                headers = {k.lower(): v for k, v in self.headers.items()}
                route = self.path.split("?")[0]
                if route == "/v1/messages/count_tokens" and fake.serve_count_tokens:
                    record = RecordedRequest(self.path, headers, body, time.monotonic())
                    with fake._lock:
                        fake.count_requests.append(record)
                    self._json(200, {"input_tokens": count_tokens(body)}, {})
                    return
                if route != "/v1/messages":
                    self._error(404, "not_found_error", f"no route {self.path!r}")
                    return
                item, record = fake._next(body, self.path, headers, self.client_address[:2])
                problems = transcript_problems(body.get("messages") or [])
                problems += attachment_problems(body.get("messages") or [])
                problems += thinking_problems(body)
                blocks = prompt_blocks(body)  # read once for the three below
                marked = breakpoints(body, blocks)
                if marked > MAX_BREAKPOINTS:
                    problems.append(
                        f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be "
                        f"provided. Found {marked}."
                    )
                if problems:
                    fake.violations.extend(problems)
                    self._error(400, "invalid_request_error", "; ".join(problems))
                    return
                window = fake.context_window_tokens
                prompt_tokens = count_tokens(body, blocks)
                if window is not None and prompt_tokens > window:
                    with fake._lock:
                        fake.too_long += 1
                        if item is not None:  # the script entry stays for the next request
                            fake._queue.insert(0, item)
                    message = f"prompt is too long: {prompt_tokens} tokens > {window} maximum"
                    self._error(400, "invalid_request_error", message)
                    return
                if item is None:
                    self._error(400, "invalid_request_error", "fake: no scripted response left")
                    return
                if isinstance(item, HttpError):
                    extra = (
                        {} if item.retry_after is None else {"retry-after": str(item.retry_after)}
                    )
                    self._error(item.status, item.type, item.message, **extra)
                    return
                scripted = item if isinstance(item, Reply) else Reply(tuple(item))
                if not body.get("stream"):
                    self._error(400, "invalid_request_error", "fake: only stream=true is served")
                    return
                # The prompt cache is read and written once the request is served.
                usage = record.usage = fake.cache.usage(body, blocks)
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                segments: list[bytes | Stall] = []
                events = sse_events(
                    scripted, f"msg_fake{next(_ids):04d}", str(body.get("model")), usage
                )
                for piece in events:
                    if isinstance(piece, bytes) and segments and isinstance(segments[-1], bytes):
                        segments[-1] += piece
                    else:
                        segments.append(piece)
                try:
                    for segment in segments:
                        if isinstance(segment, Stall):
                            segment.reached.set()
                            segment.release.wait(segment.timeout_s)
                        else:
                            self._chunks(segment)
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except OSError:
                    pass  # the client went away during a stall (a killed orchestrator)

            def _chunks(self, payload: bytes) -> None:
                pos = 0
                while pos < len(payload):
                    size = rng.randint(1, 64) if fake.split_chunks else len(payload)
                    chunk = payload[pos : pos + size]
                    self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                    self.wfile.flush()
                    pos += size

        self._server = _Server((self.host, 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeAnthropic:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
