"""HTTP routes of the proposals service (PROTOCOL.md "HTTP, proposals service"): thin."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse
from sqlalchemy import text

from services.proposals import decisions, proposals, workspaces
from services.proposals.deps import Context, CurrentUser, OwnedProposal, require_internal
from services.proposals.schemas import ApproveBody, CreateProposal, RejectBody

router = APIRouter()


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """Liveness: the process answers."""
    return {"status": "ok"}


@router.get("/readyz")
def readyz(ctx: Context) -> JSONResponse:
    """Readiness: Redis and SQL both answer."""
    problems: dict[str, str] = {}
    try:
        ctx.redis.ping()
    except Exception as exc:
        problems["redis"] = type(exc).__name__
    try:
        with ctx.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:
        problems["sql"] = type(exc).__name__
    if problems:
        return JSONResponse({"status": "unavailable", **problems}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.post("/internal/proposals", status_code=201, dependencies=[Depends(require_internal)])
def create_proposal(ctx: Context, body: CreateProposal) -> dict[str, Any]:
    """A tool worker proposes file changes for a user's conversation."""
    return proposals.proposal_json(proposals.create(ctx, body))


@router.get("/api/proposals/pending")
def list_pending(ctx: Context, user: CurrentUser) -> dict[str, Any]:
    """My pending proposals, oldest first."""
    return {"proposals": [proposals.proposal_json(p) for p in decisions.pending(ctx, user.id)]}


@router.delete("/api/proposals/all")
def reject_all(ctx: Context, user: CurrentUser, body: RejectBody | None = None) -> dict[str, Any]:
    """Reject every pending proposal of mine."""
    reason = body.reason if body else None
    return {"rejected": decisions.reject_all(ctx, user.id, reason), "status": "rejected"}


@router.get("/api/proposals/{proposal_id}")
def get_proposal(proposal: OwnedProposal) -> dict[str, Any]:
    """One of my proposals, each file with its diff."""
    return proposals.proposal_json(proposal)


@router.post("/api/proposals/{proposal_id}/approve")
def approve(
    ctx: Context, user: CurrentUser, proposal: OwnedProposal, body: ApproveBody | None = None
) -> dict[str, Any]:
    """Apply one of my proposals, or only ``files`` of it (409 with the current diff if stale)."""
    paths = body.files if body else None
    return proposals.proposal_json(decisions.approve(ctx, proposal, user.id, paths))


@router.post("/api/proposals/{proposal_id}/reject")
def reject(
    ctx: Context, user: CurrentUser, proposal: OwnedProposal, body: RejectBody | None = None
) -> dict[str, Any]:
    """Reject one of my proposals."""
    reason = body.reason if body else None
    return proposals.proposal_json(decisions.reject(ctx, proposal, user.id, reason))


@router.get("/internal/workspaces/{user_id}/{name}", dependencies=[Depends(require_internal)])
def workspace_status(ctx: Context, user_id: str, name: str) -> dict[str, Any]:
    """Whether a user's workspace exists and, if it is a git repository, its branch and state."""
    return workspaces.workspace_status(ctx, user_id, name)
