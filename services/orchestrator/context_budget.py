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

import copy
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

CHARS_PER_TOKEN = 4
SHORTENED_KEEP_CHARS = 200  # what is left of an output shortened for the budget


def estimate_tokens(value: Any) -> int:
    """Rough token count of anything JSON-serialisable (characters / 4)."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


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

    ``overhead_tokens``: what the request spends besides the messages (system, tools).
    ``count``: the tokens of one content block; None estimates.
    If shortening every output is not enough, what is left is sent as it is: the API
    answers with a clear error rather than the loop dropping the user's own words.
    """
    out = copy.deepcopy(list(messages))
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
