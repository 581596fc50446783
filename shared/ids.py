"""Opaque ids: a short kind prefix and 96 random bits, so a log line says what an id names."""

from __future__ import annotations

import secrets


def new_id(kind: str) -> str:
    """A new id such as ``conv_3f9a…`` for ``kind="conv"``."""
    return f"{kind}_{secrets.token_hex(12)}"
