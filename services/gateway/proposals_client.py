"""Calls to the proposals service on behalf of a user (internal token + X-Signalbox-User)."""

from __future__ import annotations

import logging
from typing import Any, Literal

import httpx

from services.gateway.errors import Conflict, NotFound, Unavailable
from services.gateway.state import Gateway

log = logging.getLogger(__name__)

# Hop-by-hop and framing headers are the proxy's own business, never forwarded.
_DROP_RESPONSE_HEADERS = frozenset(
    {
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "content-encoding",
        "date",
        "server",
    }
)


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])
    return str(body)[:500]


async def decide_proposal(
    gateway: Gateway,
    user_id: str,
    proposal_id: str,
    decision: Literal["approve", "reject"],
    reason: str | None = None,
) -> dict[str, Any]:
    """Approve or reject; the proposal JSON with its new ``status``.

    404 → ``NotFound``; 409 (a file changed since it was proposed) → ``Conflict``, because
    the approval did not happen; anything else unexpected → ``Unavailable``.
    """
    url = f"/api/proposals/{proposal_id}/{decision}"
    body = {"reason": reason} if decision == "reject" else None
    try:
        response = await gateway.http.post(
            url, json=body, headers=gateway.internal_headers(user_id)
        )
    except httpx.HTTPError as exc:
        raise Unavailable(f"proposals service did not answer: {exc!r}") from exc
    if response.status_code == 404:
        raise NotFound(f"proposal {proposal_id!r} not found")
    if response.status_code == 409:
        raise Conflict(f"proposal {proposal_id!r}: {_detail(response)}")
    if response.status_code != 200:
        raise Unavailable(
            f"proposals service answered {response.status_code} for {proposal_id!r}: "
            f"{_detail(response)}"
        )
    result: dict[str, Any] = response.json()
    return result


async def forward(
    gateway: Gateway,
    user_id: str,
    method: str,
    path: str,
    query: bytes,
    body: bytes,
    content_type: str | None,
) -> httpx.Response:
    """Pass one request through to ``/api/proposals/{path}`` of the proposals service."""
    headers = gateway.internal_headers(user_id)
    if content_type:
        headers["Content-Type"] = content_type
    url = httpx.URL(f"/api/proposals/{path}", query=query)
    try:
        return await gateway.http.request(method, url, content=body, headers=headers)
    except httpx.HTTPError as exc:
        raise Unavailable(f"proposals service did not answer: {exc!r}") from exc


def response_headers(response: httpx.Response) -> dict[str, str]:
    """The headers of a proxied response worth passing on."""
    return {k: v for k, v in response.headers.items() if k.lower() not in _DROP_RESPONSE_HEADERS}


WORKSPACE_STATUS_TIMEOUT_S = 10.0  # the proposals service bounds each git call at 5 s


async def workspace_status(gateway: Gateway, user_id: str, name: str) -> dict[str, Any] | None:
    """``{"name", "path_exists", "git"}`` of a workspace, or None if the service cannot say."""
    url = f"/internal/workspaces/{user_id}/{name}"
    try:
        response = await gateway.http.get(
            url, headers=gateway.internal_headers(user_id), timeout=WORKSPACE_STATUS_TIMEOUT_S
        )
    except httpx.HTTPError as exc:
        log.warning(
            "workspace status of %s/%s: proposals service did not answer: %r", user_id, name, exc
        )
        return None
    if response.status_code != 200:
        log.warning(
            "workspace status of %s/%s: proposals service answered %s: %s",
            user_id,
            name,
            response.status_code,
            _detail(response),
        )
        return None
    body = response.json()
    return body if isinstance(body, dict) else None
