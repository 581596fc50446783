"""The fake Messages API's prompt cache and token counter, by the real API's documented rules.

- A prompt is read in the order tools → system → messages, block by block; a block's
  tokens are counted by a deterministic proxy tokenizer (words and punctuation of its JSON,
  ``cache_control`` left out), plus a few for each message's role.
- A block with ``cache_control`` is a breakpoint; more than ``MAX_BREAKPOINTS`` is a 400.
- A breakpoint reads the longest prefix written earlier (same model) within its TTL, looking
  back at most ``LOOKBACK_BLOCKS`` blocks from itself; a hit refreshes the entry's TTL.
- Each breakpoint past what was read writes its prefix, if that prefix has at least
  ``min_tokens``; a shorter prefix is not cached (no error, nothing extra billed).
- Usage: ``cache_read_input_tokens`` = the prefix read, ``cache_creation_input_tokens`` =
  from there to the last prefix written, ``input_tokens`` = the rest.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_BREAKPOINTS = 4
LOOKBACK_BLOCKS = 20
DEFAULT_MIN_TOKENS = 1024  # Sonnet's minimum cacheable prefix
ROLE_TOKENS = 3  # each message's role marker
TTL_S = {"5m": 300.0, "1h": 3600.0}
_TOKEN = re.compile(r"\w+|[^\w\s]")


def proxy_tokens(text: str) -> int:
    """The proxy tokenizer: one token per word or punctuation mark."""
    return len(_TOKEN.findall(text))


# A prompt repeats most of the last one (the tools, the system prompt, the transcript so
# far), so a block's count is looked up, not counted again: counting every block of a
# 13 KB prompt took 2 ms, and the fake shares its process with the benchmarks' clients.
_block_tokens = functools.lru_cache(maxsize=16384)(proxy_tokens)


def _plain(block: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in block.items() if k != "cache_control"}, sort_keys=True)


@dataclass(frozen=True)
class _Block:
    key: str  # what identifies it in a prefix
    tokens: int
    ttl: str | None  # set on a breakpoint


def prompt_blocks(body: dict[str, Any]) -> list[_Block]:
    """The request's blocks in the order the API reads them."""
    blocks: list[_Block] = []

    def add(kind: str, block: dict[str, Any], extra_tokens: int = 0) -> None:
        marker = block.get("cache_control")
        ttl = str(marker.get("ttl") or "5m") if isinstance(marker, dict) else None
        text = _plain(block)
        blocks.append(_Block(f"{kind}:{text}", _block_tokens(text) + extra_tokens, ttl))

    for tool in body.get("tools") or []:
        add("tool", tool)
    system = body.get("system")
    if isinstance(system, str) and system:
        add("system", {"type": "text", "text": system})
    elif isinstance(system, list):
        for block in system:
            add("system", block)
    for message in body.get("messages") or []:
        role = str(message.get("role"))
        content = message.get("content")
        items = [{"type": "text", "text": content}] if isinstance(content, str) else content
        for i, block in enumerate(items or []):
            add(role if i == 0 else f"{role}+", block, ROLE_TOKENS if i == 0 else 0)
    return blocks


def count_tokens(body: dict[str, Any], blocks: Sequence[_Block] | None = None) -> int:
    """``input_tokens`` of ``POST /v1/messages/count_tokens``: the whole prompt (``blocks``:
    its ``prompt_blocks``, when the caller has them already)."""
    return sum(b.tokens for b in (prompt_blocks(body) if blocks is None else blocks))


def breakpoints(body: dict[str, Any], blocks: Sequence[_Block] | None = None) -> int:
    """How many blocks of the request carry ``cache_control``."""
    return sum(1 for b in (prompt_blocks(body) if blocks is None else blocks) if b.ttl is not None)


@dataclass
class PromptCache:
    """Cache entries by prefix hash; thread-safe (the fake serves from many threads)."""

    min_tokens: int = DEFAULT_MIN_TOKENS
    clock: Callable[[], float] = time.monotonic
    _entries: dict[str, tuple[float, float]] = field(default_factory=dict)  # expires, ttl_s
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def clear(self) -> None:
        """Forget every entry (as if the TTL passed)."""
        with self._lock:
            self._entries.clear()

    def usage(self, body: dict[str, Any], blocks: Sequence[_Block] | None = None) -> dict[str, int]:
        """The input-side usage of one request, reading and writing entries as the API does."""
        blocks = prompt_blocks(body) if blocks is None else blocks
        marks = [i for i, b in enumerate(blocks) if b.ttl is not None][:MAX_BREAKPOINTS]
        digest = hashlib.sha256(str(body.get("model")).encode())
        hashes, totals = [], [0]
        for block in blocks:
            digest.update(block.key.encode() + b"\x00")
            hashes.append(digest.hexdigest())
            totals.append(totals[-1] + block.tokens)
        now = self.clock()
        with self._lock:
            read_end = 0
            for mark in marks:
                for j in range(mark, max(-1, mark - LOOKBACK_BLOCKS), -1):
                    entry = self._entries.get(hashes[j])
                    if entry is not None and entry[0] > now:
                        self._entries[hashes[j]] = (now + entry[1], entry[1])
                        read_end = max(read_end, j + 1)
                        break
            write_end = read_end
            for mark in marks:
                if mark + 1 > read_end and totals[mark + 1] >= self.min_tokens:
                    ttl_s = TTL_S.get(str(blocks[mark].ttl), TTL_S["5m"])
                    self._entries[hashes[mark]] = (now + ttl_s, ttl_s)
                    write_end = max(write_end, mark + 1)
        return {
            "input_tokens": totals[-1] - totals[write_end],
            "cache_creation_input_tokens": totals[write_end] - totals[read_end],
            "cache_read_input_tokens": totals[read_end],
        }
