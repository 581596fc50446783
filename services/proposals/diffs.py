"""Unified diffs of a proposal's files, as a human reviews them."""

from __future__ import annotations

import difflib

NO_NEWLINE = "\\ No newline at end of file\n"


def _lines(text: str | None) -> list[str]:
    return [] if text is None else text.splitlines(keepends=True)


def unified_diff(path: str, before: str | None, after: str | None) -> str:
    """The unified diff from ``before`` to ``after`` (None: the file does not exist)."""
    out: list[str] = []
    for line in difflib.unified_diff(
        _lines(before),
        _lines(after),
        fromfile="/dev/null" if before is None else f"a/{path}",
        tofile="/dev/null" if after is None else f"b/{path}",
    ):
        out.append(line)
        # As `diff -u` does, so a last line without newline does not glue onto the next one.
        if not line.endswith("\n"):
            out.append("\n" + NO_NEWLINE)
    return "".join(out)
