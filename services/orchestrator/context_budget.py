"""Keep what the model is sent within ``SIGNALBOX_CONTEXT_TOKENS``.

Tokens are counted per content block by ``count`` when one is given (the Messages API's
``count_tokens``, each block once: ``token_count.py``), else estimated as characters / 4
over the whole transcript (the usual rule of thumb for English and code). Two rules:

1. Any tool output longer than ``max_output_chars`` is cut, with a note saying so.
2. While the estimate is over the budget, tool outputs are shortened oldest first, each
   with a note saying so. Only the *content* of ``tool_result`` blocks changes: every
   ``tool_use`` keeps its one ``tool_result``, in place, so the transcript stays valid.

The stored transcript is never changed; this shapes one request.
"""

from __future__ import annotations

import base64
import functools
import json
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

CHARS_PER_TOKEN = 4
SHORTENED_KEEP_CHARS = 200  # what is left of an output shortened for the budget
# An attachment costs what the model reads of it, not its base64 length: an image is
# scaled to at most ~1.15 megapixels, (width x height) / 750 = ~1,600 tokens at most; a
# PDF page is sent as its text and as an image of the page, ~3,000 tokens at most.
IMAGE_TOKENS = 1_600
PDF_PAGE_TOKENS = 3_000
_PDF_PAGE = re.compile(rb"/Type\s*/Page(?![A-Za-z])")


def estimate_tokens(value: Any) -> int:
    """Rough token count of anything JSON-serialisable (characters / 4; an attachment
    block by ``attachment_tokens``)."""
    if isinstance(value, list | dict) and attachment_tokens(value) is None:
        text = _plain_json(value)  # most transcripts hold no attachment: no walk needed
        if text is not None:
            return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN
    return _estimate_walk(value)


def _plain_json(value: Any) -> str | None:
    """``value``'s JSON, or None when it may hold an attachment block: a dict whose "type"
    is "image" or "document", so its JSON holds one of the markers."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return None if any(marker in text for marker in _ATTACHMENT_MARKERS) else text


def _estimate_walk(value: Any) -> int:
    """``estimate_tokens`` through the structure, each attachment block at its own cost."""
    if isinstance(value, str):
        return (len(value) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN
    fixed = attachment_tokens(value)
    if fixed is not None:
        return fixed
    if isinstance(value, list | dict) and _holds_attachment(value):
        items = value.values() if isinstance(value, dict) else value
        keys = _estimate_walk(list(value)) if isinstance(value, dict) else 0
        return keys + sum(_estimate_walk(item) for item in items)
    text = json.dumps(value, ensure_ascii=False, default=str)
    return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


_ATTACHMENT_MARKERS = ('"type": "image"', '"type": "document"')
# What a request costs beyond the JSON of its parts: the API's own tool-use system prompt
# (a few hundred tokens) and each message's framing, with room to spare.
REQUEST_FRAMING_TOKENS = 2_000


def json_bytes(value: Any) -> int | None:
    """The UTF-8 bytes of ``value``'s JSON, or None when it holds an attachment (priced by
    its pixels and pages, not its bytes: see ``surely_fits``)."""
    text = _plain_json(value)
    return None if text is None else len(text.encode())


def surely_fits(parts: Any, limit_tokens: int, known_bytes: int = 0) -> bool:
    """True when ``parts`` of a request (its messages, say) fit ``limit_tokens`` whatever the
    tokenizer: a token is at least one byte of text, so a request of fewer UTF-8 bytes than
    the limit (less ``REQUEST_FRAMING_TOKENS``) cannot exceed it. Attachments are priced by
    their pixels and pages, not their bytes: a request holding one is never sure here.
    ``known_bytes``: the ``json_bytes`` of the rest of the request, measured before (the
    system prompt and the tools, the same at every step of a turn).

    Exact counting (``token_count.py``, a ``count_tokens`` round trip per step) matters only
    where the answer could be no; most turns are far from the window.
    """
    size = json_bytes(parts)
    return size is not None and known_bytes + size + REQUEST_FRAMING_TOKENS <= limit_tokens


def attachment_tokens(block: Any) -> int | None:
    """The tokens of an ``image`` or ``document`` block (an attachment), else None."""
    if not isinstance(block, dict) or block.get("type") not in ("image", "document"):
        return None
    source = block.get("source")
    if block["type"] == "image" or not isinstance(source, dict):
        return IMAGE_TOKENS
    data = source.get("data")
    if not isinstance(data, str):
        return IMAGE_TOKENS
    if source.get("type") == "text":
        return estimate_tokens(data)
    return PDF_PAGE_TOKENS * _pdf_pages(data)


@functools.lru_cache(maxsize=64)
def _pdf_pages(data: str) -> int:
    """The pages of a base64 PDF, counted by their ``/Type /Page`` objects (at least 1)."""
    try:
        raw = base64.b64decode(data, validate=False)
    except ValueError:
        return 1
    return max(1, len(_PDF_PAGE.findall(raw)))


def _holds_attachment(value: Any) -> bool:
    """Whether a message list, message or content list holds an attachment block."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            if attachment_tokens(item) is not None:
                return True
            pending.extend(v for v in item.values() if isinstance(v, list | dict))
        elif isinstance(item, list):
            pending.extend(v for v in item if isinstance(v, list | dict))
    return False


def _cut(text: str, keep: int, why: str) -> str:
    return f"{text[:keep]}\n[{why}: {keep} of {len(text)} characters shown]"


def _results(messages: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every ``tool_result`` block with string content, oldest first."""
    for message in messages:
        content = message.get("content")
        if message.get("role") != "user" or not isinstance(content, list):
            continue
        for block in content:
            if (
                isinstance(block, dict)
                and block.get("type") == "tool_result"
                and isinstance(block.get("content"), str)
            ):
                yield block


def _is_result(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") == "tool_result"


def _results_owned(message: dict[str, Any]) -> dict[str, Any]:
    """``message``, or a copy of it whose ``tool_result`` blocks are copies, to change."""
    content = message.get("content")
    if message.get("role") != "user" or not isinstance(content, list):
        return message
    if not any(_is_result(block) for block in content):
        return message
    return {**message, "content": [dict(b) if _is_result(b) else b for b in content]}


def blocks(messages: list[dict[str, Any]]) -> Iterator[Any]:
    """Every content block, oldest first (a string content is one block)."""
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            yield from content
        elif content:
            yield content


def fit(
    messages: Sequence[dict[str, Any]],
    budget_tokens: int,
    max_output_chars: int,
    overhead_tokens: int = 0,
    count: Callable[[Any], int] | None = None,
) -> list[dict[str, Any]]:
    """A copy of ``messages`` with tool outputs capped, then shortened oldest first to fit.

    Copied where it may change (each message holding a ``tool_result``, its content list
    and those blocks, shallowly); everything else is shared with ``messages``, which is
    left as it was. A deep copy of the whole transcript each step cost more than the rest.

    ``overhead_tokens``: what the request spends besides the messages (system, tools).
    ``count``: the tokens of one content block; None estimates.
    If shortening every output is not enough, what is left is sent as it is: the API
    answers with a clear error rather than the loop dropping the user's own words.
    """
    out = [_results_owned(message) for message in messages]
    for block in _results(out):
        text = block["content"]
        if len(text) > max_output_chars:
            block["content"] = _cut(text, max_output_chars, "output truncated")
    size = count or (lambda block: estimate_tokens(block["content"]))
    total = overhead_tokens + (
        estimate_tokens(out) if count is None else sum(count(b) for b in blocks(out))
    )
    if total <= budget_tokens:
        return out
    for block in _results(out):
        text = block["content"]
        if len(text) <= SHORTENED_KEEP_CHARS + 80:  # already short: shortening saves nothing
            continue
        before = size(block)
        block["content"] = _cut(text, SHORTENED_KEEP_CHARS, "shortened to fit the context budget")
        total -= before - size(block)
        if total <= budget_tokens:
            break
    return out
