"""What the terminal commands need from the gateway's HTTP API: the token, and proposals.

``signalbox chat`` and ``signalbox proposals`` both talk to one gateway URL with a user's
bearer token; this module finds the token and wraps the ``/api/proposals/...`` routes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

DEFAULT_GATEWAY_URL = "http://127.0.0.1:8000"
TOKEN_ENV = "SIGNALBOX_TOKEN"
# Where `signalbox up` (run from the same directory) keeps the admin's token.
ADMIN_TOKEN_FILE = Path("var") / "admin-token"
HTTP_TIMEOUT_S = 30.0  # an approval applies files and commits; give it room


class ApiError(RuntimeError):
    """The gateway refused or could not do a request; the message is for the operator."""


class NotFound(ApiError):
    """No such object for this user (another user's object is not found either)."""


class Conflict(ApiError):
    """The request clashes with the object's state, e.g. a file changed since the proposal."""

    def __init__(self, message: str, body: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.body: dict[str, Any] = dict(body or {})


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
    try:
        saved = token_file.read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        saved = ""
    if saved:
        return saved
    raise ApiError(
        f"no API token: pass --token, set {TOKEN_ENV}, or run from the directory of "
        f"`signalbox up` (no {str(token_file)!r} here)"
    )


def ws_url(gateway_url: str) -> str:
    """The WebSocket URL of the gateway at ``gateway_url`` (``http(s)://host:port``)."""
    base = gateway_url.rstrip("/")
    if base.startswith("https://"):
        return "wss://" + base.removeprefix("https://") + "/ws"
    if base.startswith("http://"):
        return "ws://" + base.removeprefix("http://") + "/ws"
    raise ApiError(f"expected a gateway URL starting http:// or https://, got {gateway_url!r}")


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:300] or response.reason_phrase
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])
    return str(body)[:300]


class ProposalsApi:
    """The gateway's ``/api/proposals/...`` routes, acting as the token's user."""

    def __init__(self, gateway_url: str, token: str, timeout_s: float = HTTP_TIMEOUT_S) -> None:
        self.base = gateway_url.rstrip("/")
        self.client = httpx.Client(
            base_url=self.base,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout_s,
        )

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self.client.close()

    def _request(self, method: str, path: str, what: str, json: Any = None) -> dict[str, Any]:
        try:
            response = self.client.request(method, path, json=json)
        except httpx.HTTPError as exc:
            raise ApiError(f"cannot reach the gateway at {self.base}: {exc!r}") from None
        if response.status_code == 401:
            raise ApiError(f"the gateway at {self.base} refused the token (401)")
        if response.status_code == 404:
            raise NotFound(f"{what} not found")
        if response.status_code == 409:
            body = response.json() if _is_json(response) else {}
            raise Conflict(f"{what}: conflict: {_detail(response)}", body)
        if response.status_code >= 400:
            raise ApiError(
                f"{what}: the gateway answered {response.status_code}: {_detail(response)}"
            )
        result: dict[str, Any] = response.json()
        return result

    def pending(self) -> list[dict[str, Any]]:
        """My pending proposals, oldest first."""
        body = self._request("GET", "/api/proposals/pending", "pending proposals")
        proposals: list[dict[str, Any]] = body.get("proposals", [])
        return proposals

    def get(self, proposal_id: str) -> dict[str, Any]:
        """One proposal with each file's diff."""
        return self._request("GET", f"/api/proposals/{proposal_id}", _what(proposal_id))

    def approve(self, proposal_id: str) -> dict[str, Any]:
        """Apply a proposal; ``Conflict`` if a file changed since it was proposed."""
        return self._request("POST", f"/api/proposals/{proposal_id}/approve", _what(proposal_id))

    def reject(self, proposal_id: str, reason: str | None = None) -> dict[str, Any]:
        """Reject a proposal."""
        return self._request(
            "POST",
            f"/api/proposals/{proposal_id}/reject",
            _what(proposal_id),
            json={"reason": reason},
        )


def _what(proposal_id: str) -> str:
    return f"proposal {proposal_id!r}"


def _is_json(response: httpx.Response) -> bool:
    content_type: str = response.headers.get("content-type", "")
    return content_type.startswith("application/json")
