"""What the terminal commands need to reach the gateway: its URL, the token, and proposals.

``signalbox chat`` and ``signalbox proposals`` both talk to one gateway with a user's bearer
token through the SDK (``signalbox.client``); this module finds the URL and the token and
keeps the commands' dict-shaped view of proposals (what ``chat_render`` prints).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from signalbox.client import Client, Conflict, NotFound, SignalboxError, ws_url

DEFAULT_GATEWAY_URL = "http://127.0.0.1:8000"
TOKEN_ENV = "SIGNALBOX_TOKEN"
GATEWAY_URL_ENV = "SIGNALBOX_GATEWAY_URL"
# Where `signalbox up` (run from the same directory) keeps the admin's token and its URL.
ADMIN_TOKEN_FILE = Path("var") / "admin-token"
GATEWAY_URL_FILE = Path("var") / "gateway-url"
HTTP_TIMEOUT_S = 30.0  # an approval applies files and commits; give it room

ApiError = SignalboxError  # the commands' name for any refusal (kept for their callers)

__all__ = [
    "ApiError",
    "Conflict",
    "NotFound",
    "ProposalsApi",
    "resolve_token",
    "resolve_url",
    "ws_url",
]


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return ""


def resolve_token(
    given: str | None,
    env: Mapping[str, str] | None = None,
    token_file: Path = ADMIN_TOKEN_FILE,
) -> str:
    """The token to use: ``--token``, else ``$SIGNALBOX_TOKEN``, else ``./var/admin-token``."""
    if given:
        return given
    env = os.environ if env is None else env
    if env.get(TOKEN_ENV):
        return env[TOKEN_ENV]
    saved = _read(token_file)
    if saved:
        return saved
    raise ApiError(
        f"no API token: pass --token, set {TOKEN_ENV}, or run from the directory of "
        f"`signalbox up` (no {str(token_file)!r} here)"
    )


def resolve_url(
    given: str | None,
    env: Mapping[str, str] | None = None,
    url_file: Path = GATEWAY_URL_FILE,
) -> str:
    """The gateway to use: ``--url``, else ``$SIGNALBOX_GATEWAY_URL``, else the URL
    ``signalbox up`` wrote to ``./var/gateway-url``, else ``http://127.0.0.1:8000``."""
    if given:
        return given
    env = os.environ if env is None else env
    return env.get(GATEWAY_URL_ENV) or _read(url_file) or DEFAULT_GATEWAY_URL


class ProposalsApi:
    """The gateway's ``/api/proposals/...`` routes through the SDK, as plain dicts."""

    def __init__(self, gateway_url: str, token: str, timeout_s: float = HTTP_TIMEOUT_S) -> None:
        self.base = gateway_url.rstrip("/")
        self.client = Client(self.base, token, timeout_s)

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self.client.close()

    def pending(self) -> list[dict[str, Any]]:
        """My pending proposals, oldest first."""
        return [p.model_dump(mode="json") for p in self.client.pending_proposals()]

    def get(self, proposal_id: str) -> dict[str, Any]:
        """One proposal with each file's diff."""
        return self.client.proposal(proposal_id).model_dump(mode="json")

    def approve(self, proposal_id: str) -> dict[str, Any]:
        """Apply a proposal; ``Conflict`` if a file changed since it was proposed."""
        return self.client.approve(proposal_id).model_dump(mode="json")

    def reject(self, proposal_id: str, reason: str | None = None) -> dict[str, Any]:
        """Reject a proposal."""
        return self.client.reject(proposal_id, reason).model_dump(mode="json")
