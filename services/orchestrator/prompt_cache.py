"""Where a model request marks its cacheable prefix (the Messages API's prompt caching).

The API caches a prompt's prefix up to each block that carries ``cache_control``; the
prompt is read in the order tools → system → messages, and a later request whose prefix is
byte-identical up to a marked block reads it from the cache (billed at a tenth of the input
price) instead of processing it again. At most ``MAX_BREAKPOINTS`` blocks may be marked.
Every request of the agent loop marks:

1. the last tool: the tool definitions, shared by every step of every conversation;
2. the system prompt: tools and system, the same for every step (it holds no timestamp or id);
3. the last block of the user message that ended the previous request (the user message
   before the last assistant message): the prefix the previous step wrote, read back here
   exactly, however many blocks (parallel tool results) were added since — the API looks
   back only 20 blocks from a breakpoint for an earlier entry;
4. the last block of the last message: the whole prompt, written for the next step to read.

A prefix shorter than the model's minimum (1,024 tokens or more, by model) is not cached
and costs nothing extra. The transcript given is never changed: marked blocks are copies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

MAX_BREAKPOINTS = 4  # the Messages API refuses a request with more blocks marked
CacheTtl = Literal["5m", "1h"]


def cache_control(ttl: CacheTtl) -> dict[str, str]:
    """The marker of one breakpoint."""
    return {"type": "ephemeral", "ttl": ttl}


@dataclass(frozen=True)
class CachedPrompt:
    """A request's ``tools``, ``system`` and ``messages``, with breakpoints marked."""

    tools: list[dict[str, Any]]
    system: list[dict[str, Any]]
    messages: list[dict[str, Any]]

    def breakpoints(self) -> int:
        """How many blocks carry ``cache_control``."""
        blocks = [*self.tools, *self.system]
        for message in self.messages:
            content = message.get("content")
            if isinstance(content, list):
                blocks.extend(b for b in content if isinstance(b, dict))
        return sum(1 for b in blocks if "cache_control" in b)


def _marked_message(message: dict[str, Any], marker: dict[str, str]) -> dict[str, Any] | None:
    """A copy of ``message`` whose last block carries ``marker``; None if it has no block."""
    content = message.get("content")
    if isinstance(content, str):
        blocks: list[Any] = [{"type": "text", "text": content}] if content else []
    elif isinstance(content, list):
        blocks = list(content)
    else:
        blocks = []
    if not blocks or not isinstance(blocks[-1], dict):
        return None
    blocks[-1] = {**blocks[-1], "cache_control": marker}
    return {**message, "content": blocks}


def _previous_end(messages: list[dict[str, Any]]) -> int | None:
    """The index of the user message that ended the previous request, if there is one."""
    for i in range(len(messages) - 2, 0, -1):
        if messages[i].get("role") == "assistant":
            before = i - 1
            return before if messages[before].get("role") == "user" else None
    return None


def mark(
    system: str,
    tools: list[dict[str, Any]],
    messages: list[dict[str, Any]],
    ttl: CacheTtl | None,
) -> CachedPrompt:
    """The request's parts with breakpoints marked (none when ``ttl`` is None)."""
    system_blocks: list[dict[str, Any]] = [{"type": "text", "text": system}] if system else []
    if ttl is None:
        return CachedPrompt(list(tools), system_blocks, list(messages))
    marker = cache_control(ttl)
    marked_tools = list(tools)
    if marked_tools:
        marked_tools[-1] = {**marked_tools[-1], "cache_control": marker}
    if system_blocks:
        system_blocks[-1] = {**system_blocks[-1], "cache_control": marker}
    marked_messages = list(messages)
    targets = [len(messages) - 1] if messages else []
    previous = _previous_end(messages)
    if previous is not None:
        targets.append(previous)
    for index in targets:
        copy = _marked_message(marked_messages[index], marker)
        if copy is not None:
            marked_messages[index] = copy
    prompt = CachedPrompt(marked_tools, system_blocks, marked_messages)
    assert prompt.breakpoints() <= MAX_BREAKPOINTS
    return prompt
