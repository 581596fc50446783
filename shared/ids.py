"""Opaque ids: a short kind prefix and 96 random bits, so a log line says what an id names."""

from __future__ import annotations

import re
import secrets

# Every id a client may send back: letters, digits, '_' and '-', no longer than the SQL id
# columns. Nothing in it can climb a path, break a URL or reach the database as a NUL, so
# an id that matches may be put in a path or an upstream URL as it is.
ID_MAX_CHARS = 40
ID_PATTERN = rf"^[A-Za-z0-9_-]{{1,{ID_MAX_CHARS}}}$"
_ID = re.compile(ID_PATTERN)


def new_id(kind: str) -> str:
    """A new id such as ``conv_3f9a…`` for ``kind="conv"``."""
    return f"{kind}_{secrets.token_hex(12)}"


def is_id(text: str) -> bool:
    """Whether ``text`` has the form of an id (``ID_PATTERN``)."""
    return _ID.fullmatch(text) is not None
