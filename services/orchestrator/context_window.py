"""How many tokens each model's context window holds, and what a request may spend of it.

Claude models read 200k tokens (the 1M-token window is a beta a deployment opts into, and
then says so with ``SIGNALBOX_CONTEXT_WINDOW_TOKENS``, which overrides this table).
"""

from __future__ import annotations

DEFAULT_WINDOW_TOKENS = 200_000  # a model this table does not know: as Claude's
WINDOWS: tuple[tuple[str, int], ...] = (("claude-", 200_000),)  # by name prefix
# What a request keeps free for the answer, at most: a quarter of a small window.
OUTPUT_RESERVE_FRACTION = 0.25


def window_tokens(model: str, override: int | None = None) -> int:
    """The context window of ``model`` (``override``: the deployment's setting)."""
    if override is not None:
        return override
    for prefix, tokens in WINDOWS:
        if model.startswith(prefix):
            return tokens
    return DEFAULT_WINDOW_TOKENS


def input_budget(window: int, max_tokens: int) -> int:
    """The prompt tokens a request may send: the window less room for its answer."""
    return window - min(max_tokens, int(window * OUTPUT_RESERVE_FRACTION))
