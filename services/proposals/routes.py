"""HTTP routes of the proposals service (PROTOCOL.md "HTTP, proposals service"): thin."""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query
from fastapi.responses import JSONResponse
from sqlalchemy import text

from signalbox.services.proposals import decisions, proposals, revert, workspaces
from signalbox.services.proposals.deps import (
    Context,
    CurrentUser,
    IdPath,
    OwnedProposal,
    require_internal,
)
from signalbox.shared.db import Proposal
from signalbox.shared.log_context import log_context
from signalbox.shared.proposals_api import (
    DECIDED_DEFAULT_LIMIT,
    ApproveBody,
    CreateProposal,
    DecidedLimit,
    DecidedProposals,
    ErrorDetail,
    PendingProposals,
    ProposalPublic,
    ProposalRefusal,
    RejectBody,
    RejectedAll,
    RevertBody,
    WorkspaceStatus,
)
from signalbox.shared.workspace_paths import WORKSPACE_NAME_MAX_CHARS, WORKSPACE_NAME_PATTERN

router = APIRouter()
log = logging.getLogger(__name__)


def _proposal_log_context(proposal: Proposal) -> AbstractContextManager[None]:
    return log_context(
        conversation_id=proposal.conversation_id,
        turn_id=proposal.turn_id,
        call_id=proposal.call_id,
        user_id=proposal.user_id,
    )


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


# What the public routes answer besides 200: documented in the OpenAPI, as in docs/protocol.md.
_NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorDetail}}
_DECISION: dict[int | str, dict[str, Any]] = {**_NOT_FOUND, 409: {"model": ProposalRefusal}}

WorkspaceNamePath = Annotated[
    str, Path(pattern=WORKSPACE_NAME_PATTERN, max_length=WORKSPACE_NAME_MAX_CHARS)
]


@router.post(
    "/internal/proposals",
    status_code=201,
    dependencies=[Depends(require_internal)],
    responses={404: {"model": ErrorDetail}, 409: {"model": ErrorDetail}},
)
def create_proposal(ctx: Context, body: CreateProposal) -> ProposalPublic:
    """A tool worker proposes file changes for a user's conversation (404 unless theirs)."""
    with log_context(
        conversation_id=body.conversation_id,
        turn_id=body.turn_id,
        call_id=body.call_id,
        user_id=body.user_id,
    ):
        created = proposals.create(ctx, body)
        log.info("proposal %s created: %d file(s)", created.id, len(body.files))
        return proposals.proposal_public(created)


@router.get("/api/proposals/pending")
def list_pending(ctx: Context, user: CurrentUser) -> PendingProposals:
    """My pending proposals, oldest first."""
    pending = decisions.pending(ctx, user.id)
    return PendingProposals(proposals=[proposals.proposal_public(p) for p in pending])


@router.get("/api/proposals/decided")
def list_decided(
    ctx: Context, user: CurrentUser, limit: Annotated[DecidedLimit, Query()] = DECIDED_DEFAULT_LIMIT
) -> DecidedProposals:
    """My ``limit`` most recently decided proposals, newest first."""
    decided = proposals.decided_of(ctx, user.id, limit)
    return DecidedProposals(proposals=[proposals.proposal_public(p) for p in decided])


@router.delete("/api/proposals/all")
def reject_all(ctx: Context, user: CurrentUser, body: RejectBody | None = None) -> RejectedAll:
    """Reject every pending proposal of mine."""
    reason = body.reason if body else None
    return RejectedAll(rejected=decisions.reject_all(ctx, user.id, reason))


@router.get("/api/proposals/{proposal_id}", responses=_NOT_FOUND)
def get_proposal(proposal: OwnedProposal) -> ProposalPublic:
    """One of my proposals, each file with its diff."""
    return proposals.proposal_public(proposal)


@router.post("/api/proposals/{proposal_id}/approve", responses=_DECISION)
def approve(
    ctx: Context, user: CurrentUser, proposal: OwnedProposal, body: ApproveBody | None = None
) -> ProposalPublic:
    """Apply one of my proposals, or only ``files`` of it (409 with the current diff if stale)."""
    paths = body.files if body else None
    with _proposal_log_context(proposal):
        decided = decisions.approve(ctx, proposal, user.id, paths)
        log.info("proposal %s approved: %s", decided.id, decided.status)
        return proposals.proposal_public(decided)


@router.post("/api/proposals/{proposal_id}/reject", responses=_DECISION)
def reject(
    ctx: Context, user: CurrentUser, proposal: OwnedProposal, body: RejectBody | None = None
) -> ProposalPublic:
    """Reject one of my proposals."""
    reason = body.reason if body else None
    with _proposal_log_context(proposal):
        decided = decisions.reject(ctx, proposal, user.id, reason)
        log.info("proposal %s rejected: %s", decided.id, decided.status)
        return proposals.proposal_public(decided)


@router.post("/api/proposals/{proposal_id}/revert", status_code=201, responses=_DECISION)
def revert_proposal(
    ctx: Context, proposal: OwnedProposal, body: RevertBody | None = None
) -> ProposalPublic:
    """Propose undoing one of my applied proposals (or its turn's): a new pending proposal."""
    scope = body.scope if body else "proposal"
    return proposals.proposal_public(revert.revert(ctx, proposal, scope))


@router.get(
    "/internal/workspaces/{user_id}/{name}",
    dependencies=[Depends(require_internal)],
    responses=_NOT_FOUND,
)
def workspace_status(ctx: Context, user_id: IdPath, name: WorkspaceNamePath) -> WorkspaceStatus:
    """Whether a user's workspace exists and, if it is a git repository, its branch and state."""
    return WorkspaceStatus.model_validate(workspaces.workspace_status(ctx, user_id, name))
