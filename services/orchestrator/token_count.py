"""Exact token counts for the context budget: the Messages API's ``count_tokens``, per block.

``context_budget.fit`` needs the size of what a step sends. With the real model, each
content block (and the system prompt, and the tool definitions) is counted by the API's
``messages.count_tokens`` once, and the count is kept by the block's content hash: a step
counts only the blocks it has not seen, never the whole transcript again, and those in one
request (``prime``: a resumed conversation's first step asks once, not once per block; the
batch's exact total is shared among its blocks in proportion to their estimates). Offline (the demo
model), with ``SIGNALBOX_TOKEN_COUNTING=estimate``, or once the API refuses to count (a
proxy without the endpoint), the characters / 4 estimate stands in.

A block is counted as the text the model reads of it (a text block's text, a tool call's
name and input, a tool result's content) in a one-message request; what any message costs
anyway (measured once, as the count of a one-character message less one) is taken off.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import OrderedDict
from typing import Any, Protocol

import anthropic

from signalbox.services.orchestrator.context_budget import attachment_tokens, estimate_tokens

log = logging.getLogger(__name__)

MAX_CACHED_BLOCKS = 50_000  # distinct blocks whose count is kept (a few MB)


class TokenCounter(Protocol):
    """Counts the tokens of one block, string or JSON value."""

    def count(self, value: Any) -> int:
        """Tokens of ``value``."""
        ...

    def prime(self, values: list[Any]) -> None:
        """Count the ``values`` not yet counted, all at once (``count`` then finds them)."""
        ...


def block_text(value: Any) -> str:
    """The text the model reads of a block (or of any string or JSON value)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        kind = value.get("type")
        if kind == "text" and isinstance(value.get("text"), str):
            return str(value["text"])
        if kind == "tool_use":
            return f"{value.get('name', '')} {json.dumps(value.get('input'), sort_keys=True)}"
        if kind == "tool_result" and isinstance(value.get("content"), str):
            return str(value["content"])
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


class ApiTokenCounter:
    """``TokenCounter`` on ``messages.count_tokens``, each distinct block counted once."""

    def __init__(self, client: anthropic.Anthropic, model: str) -> None:
        self._client = client
        self._model = model
        self._counts: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()
        self._per_message: int | None = None
        self._broken = False
        self.api_calls = 0  # how many times the API was asked (tests, metrics)

    def count(self, value: Any) -> int:
        """Tokens of ``value``: from the cache, else the API, else the estimate."""
        fixed = attachment_tokens(value)  # an image or document: never sent as text to count
        if fixed is not None:
            return fixed
        text = block_text(value)
        if not text:
            return 0
        key = hashlib.sha256(text.encode()).hexdigest()
        with self._lock:
            if key in self._counts:
                self._counts.move_to_end(key)
                return self._counts[key]
        counted = self._ask(text)
        if counted is None:
            return estimate_tokens(text)
        with self._lock:
            self._counts[key] = counted
            if len(self._counts) > MAX_CACHED_BLOCKS:
                self._counts.popitem(last=False)
        return counted

    def prime(self, values: list[Any]) -> None:
        """Count the distinct ``values`` not yet counted in one request."""
        fresh: dict[str, str] = {}
        with self._lock:
            for value in values:
                if attachment_tokens(value) is not None:
                    continue
                text = block_text(value)
                key = hashlib.sha256(text.encode()).hexdigest()
                if text and key not in self._counts:
                    fresh[key] = text
        if len(fresh) < 2:
            return  # one block is counted exactly by count()
        total = self._ask_many(list(fresh.values()))
        if total is None:
            return
        estimates = [max(1, estimate_tokens(t)) for t in fresh.values()]
        shares = _shares(total, estimates)
        with self._lock:
            for key, share in zip(fresh, shares, strict=True):
                self._counts[key] = share
            while len(self._counts) > MAX_CACHED_BLOCKS:
                self._counts.popitem(last=False)

    def _ask(self, text: str) -> int | None:
        return self._ask_many([text])

    def _ask_many(self, texts: list[str]) -> int | None:
        """The tokens of ``texts`` as blocks of one message, less what any message costs."""
        if self._broken:
            return None
        try:
            if self._per_message is None:
                self._per_message = max(0, self._raw(["."]) - 1)
            return max(0, self._raw(texts) - self._per_message)
        except anthropic.APIError as exc:
            self._broken = True  # the estimate from now on: a step must never wait on this
            log.warning("count_tokens failed (%s): the context budget estimates from now on", exc)
            return None

    def _raw(self, texts: list[str]) -> int:
        self.api_calls += 1
        content: Any = [{"type": "text", "text": t} for t in texts]
        result = self._client.messages.count_tokens(
            model=self._model, messages=[{"role": "user", "content": content}]
        )
        return int(result.input_tokens)


def _shares(total: int, weights: list[int]) -> list[int]:
    """``total`` split in proportion to ``weights``, in whole tokens that sum to ``total``."""
    whole = sum(weights)
    exact = [total * w / whole for w in weights]
    shares = [int(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: shares[i] - exact[i])
    for i in by_remainder[: total - sum(shares)]:
        shares[i] += 1
    return shares


class EstimateCounter:
    """``TokenCounter`` by characters / 4, for the demo model and offline use."""

    def count(self, value: Any) -> int:
        """Estimated tokens of ``value``."""
        fixed = attachment_tokens(value)
        return fixed if fixed is not None else estimate_tokens(block_text(value))

    def prime(self, values: list[Any]) -> None:
        """Nothing to do: estimates are computed on the spot."""
