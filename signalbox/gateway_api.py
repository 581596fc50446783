"""Where the terminal commands find the gateway and the user's token.

``signalbox chat``, ``proposals`` and ``agents`` talk to one gateway with a user's bearer
token through the SDK (``signalbox.client``); this module only resolves the URL and the
token, from the flag, the environment, or what ``signalbox up`` left in ``./var``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from signalbox.client import SignalboxError

DEFAULT_GATEWAY_URL = "http://127.0.0.1:8000"
TOKEN_ENV = "SIGNALBOX_TOKEN"
GATEWAY_URL_ENV = "SIGNALBOX_GATEWAY_URL"
# Where `signalbox up` (run from the same directory) keeps the admin's token and its URL.
ADMIN_TOKEN_FILE = Path("var") / "admin-token"
GATEWAY_URL_FILE = Path("var") / "gateway-url"

ApiError = SignalboxError  # the commands' name for any refusal (kept for their callers)

__all__ = ["ApiError", "resolve_token", "resolve_url"]


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
