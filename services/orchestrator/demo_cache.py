"""The offline demo model's prompt cache: usage reported the way the Messages API reports it.

So that ``signalbox up`` without an API key shows what caching does, the demo model marks
its requests like the real one (``prompt_cache.mark``) and accounts for them by the API's
rules: blocks read tools → system → messages; a breakpoint reads the longest prefix written
earlier within its TTL, looking back at most 20 blocks; each breakpoint past that writes its
prefix if it has at least the minimum; what follows the last breakpoint written is plain
input. Tokens are estimated (characters / 4), as the demo's usage always was.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from signalbox.services.orchestrator.context_budget import estimate_tokens
from signalbox.services.orchestrator.prompt_cache import CachedPrompt

LOOKBACK_BLOCKS = 20
MIN_CACHEABLE_TOKENS = 1024
TTL_S = {"5m": 300.0, "1h": 3600.0}


def _blocks(prompt: CachedPrompt) -> list[tuple[str, int, str | None]]:
    """(identity, tokens, TTL if a breakpoint) of each block, in the order the API reads."""
    out: list[tuple[str, int, str | None]] = []

    def add(where: str, block: Any) -> None:
        marker = block.get("cache_control") if isinstance(block, dict) else None
        plain = {k: v for k, v in block.items() if k != "cache_control"}
        text = json.dumps(plain, sort_keys=True, default=str)
        ttl = str(marker.get("ttl", "5m")) if isinstance(marker, dict) else None
        out.append((f"{where}:{text}", estimate_tokens(text), ttl))

    for tool in prompt.tools:
        add("tool", tool)
    for block in prompt.system:
        add("system", block)
    for i, message in enumerate(prompt.messages):
        content = message.get("content")
        items = [{"type": "text", "text": content}] if isinstance(content, str) else content
        for block in items or []:
            add(f"{i}:{message.get('role')}", block)
    return out


class DemoPromptCache:
    """Cache entries by prefix hash, with their expiry; shared by the process's turns."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._entries: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def usage(self, prompt: CachedPrompt) -> tuple[int, int, int]:
        """``(input, cache written, cache read)`` tokens of one request."""
        blocks = _blocks(prompt)
        digest = hashlib.sha256()
        hashes: list[str] = []
        totals = [0]
        for identity, tokens, _ttl in blocks:
            digest.update(identity.encode() + b"\x00")
            hashes.append(digest.hexdigest())
            totals.append(totals[-1] + tokens)
        marks = [i for i, (_, _, ttl) in enumerate(blocks) if ttl is not None]
        now = self._clock()
        with self._lock:
            self._entries = {k: v for k, v in self._entries.items() if v[0] > now}
            read_end = 0
            for mark in marks:
                for j in range(mark, max(-1, mark - LOOKBACK_BLOCKS), -1):
                    entry = self._entries.get(hashes[j])
                    if entry is not None:
                        self._entries[hashes[j]] = (now + entry[1], entry[1])
                        read_end = max(read_end, j + 1)
                        break
            write_end = read_end
            for mark in marks:
                if mark + 1 > read_end and totals[mark + 1] >= MIN_CACHEABLE_TOKENS:
                    ttl_s = TTL_S.get(str(blocks[mark][2]), TTL_S["5m"])
                    self._entries[hashes[mark]] = (now + ttl_s, ttl_s)
                    write_end = max(write_end, mark + 1)
        fresh, written = totals[-1] - totals[write_end], totals[write_end] - totals[read_end]
        return fresh, written, totals[read_end]
