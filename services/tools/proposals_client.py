"""The write tools' only way to change a workspace: ask the proposals service for a proposal."""

from __future__ import annotations

import hashlib
from typing import Any

import httpx

from signalbox.services.tools.registry import ToolContext, ToolError, ToolOutput
from signalbox.shared.proposals_api import FileChange

__all__ = ["FileChange", "propose", "sha256_hex"]

PROPOSALS_TIMEOUT_S = 10.0  # well inside every write tool's own time limit
INTERNAL_TOKEN_HEADER = "X-Signalbox-Internal-Token"
USER_HEADER = "X-Signalbox-User"


def sha256_hex(data: bytes) -> str:
    """The hash a proposal is made against (compare-and-swap on apply)."""
    return hashlib.sha256(data).hexdigest()


def make_client(proposals_url: str, internal_token: str) -> httpx.Client:
    """An HTTP client for the proposals service's internal routes."""
    return httpx.Client(
        base_url=proposals_url,
        headers={INTERNAL_TOKEN_HEADER: internal_token},
        timeout=PROPOSALS_TIMEOUT_S,
    )


def _detail(response: httpx.Response) -> str:
    try:
        body: Any = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])
    return str(body)[:500]


def _reason(response: httpx.Response) -> str | None:
    try:
        body: Any = response.json()
    except ValueError:
        return None
    return body.get("reason") if isinstance(body, dict) else None


def propose(ctx: ToolContext, summary: str, files: list[FileChange]) -> ToolOutput:
    """Create a proposal for ``files``; the text tells the model it awaits approval."""
    payload = {
        "user_id": ctx.user_id,
        "conversation_id": ctx.conversation_id,
        "turn_id": ctx.turn_id,
        "call_id": ctx.call_id,
        "workspace": ctx.workspace_name,
        "summary": summary,
        "files": [f.model_dump(mode="json") for f in files],
    }
    try:
        response = ctx.proposals.post(
            "/internal/proposals", json=payload, headers={USER_HEADER: ctx.user_id}
        )
    except httpx.HTTPError as exc:
        raise ToolError(
            f"the proposals service at {str(ctx.proposals.base_url)!r} did not answer: {exc}"
        ) from None
    if response.status_code == 409 and _reason(response) == "turn_cancelled":
        raise ToolError(f"nothing was proposed: {_detail(response)}")
    if response.status_code == 409:
        raise ToolError(
            f"the file changed since it was read; read it again and retry: {_detail(response)}"
        )
    if response.status_code in (403, 404, 422):  # 403: a quota; 404: not the user's own
        raise ToolError(f"the proposal was refused: {_detail(response)}")
    if response.status_code != 201:
        raise ToolError(
            f"the proposals service answered {response.status_code}: {_detail(response)}"
        )
    proposal_id = response.json().get("proposal_id")
    if not isinstance(proposal_id, str):
        raise ToolError(f"the proposals service answered without a proposal_id: {response.text!r}")
    return ToolOutput(
        text=f"proposed, awaiting approval (proposal_id {proposal_id})",
        extra={"proposal_id": proposal_id},
    )
