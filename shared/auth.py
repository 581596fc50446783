"""API tokens: random secrets shown once, stored only as a SHA-256 hash."""

from __future__ import annotations

import hashlib
import hmac
import secrets

TOKEN_PREFIX = "sbt_"


def new_token() -> str:
    """A new API token (256 random bits)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """The stored form of a token."""
    return hashlib.sha256(token.encode()).hexdigest()


def same_secret(given: str, expected: str) -> bool:
    """Constant-time comparison of two secrets."""
    return hmac.compare_digest(given.encode(), expected.encode())
