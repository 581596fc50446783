"""``/api/proposals/...``: the proposals service's public routes, served for the caller.

One explicit route per operation, never a pass-through: the gateway calls the service with
the internal token, so a path of the user's reaching the upstream URL could climb to the
internal routes and act as anyone (issue 12). Each route checks its proposal id before any
URL is built, and the upstream URL is made of that id and fixed words only.
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from signalbox.services.gateway import proposals_client
from signalbox.services.gateway.deps import CurrentUser, GatewayDep, IdPath
from signalbox.services.gateway.proposals_client import Refused
from signalbox.shared.proposals_api import (
    DECIDED_DEFAULT_LIMIT,
    ApproveBody,
    DecidedLimit,
    DecidedProposals,
    ErrorDetail,
    PendingProposals,
    ProposalPublic,
    ProposalRefusal,
    RejectBody,
    RejectedAll,
    RevertBody,
)

router = APIRouter(prefix="/api/proposals")

M = TypeVar("M", bound=BaseModel)

# What the routes answer besides 200, as the proposals service does (docs/protocol.md).
_NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorDetail}}
_DECISION: dict[int | str, dict[str, Any]] = {**_NOT_FOUND, 409: {"model": ProposalRefusal}}


def _reply(result: M | Refused) -> M | JSONResponse:
    if isinstance(result, Refused):
        return JSONResponse(result.body, result.status_code)
    return result


@router.get("/pending", response_model=PendingProposals)
async def list_pending(user: CurrentUser, gateway: GatewayDep) -> PendingProposals | JSONResponse:
    """My pending proposals, oldest first."""
    return _reply(await proposals_client.pending(gateway, user.id))


@router.get("/decided", response_model=DecidedProposals)
async def list_decided(
    user: CurrentUser,
    gateway: GatewayDep,
    limit: Annotated[DecidedLimit, Query()] = DECIDED_DEFAULT_LIMIT,
) -> DecidedProposals | JSONResponse:
    """My ``limit`` most recently decided proposals, newest first."""
    return _reply(await proposals_client.decided(gateway, user.id, limit))


@router.delete("/all", response_model=RejectedAll)
async def reject_all(
    user: CurrentUser, gateway: GatewayDep, body: RejectBody | None = None
) -> RejectedAll | JSONResponse:
    """Reject every pending proposal of mine."""
    return _reply(await proposals_client.reject_all(gateway, user.id, body))


@router.get("/{proposal_id}", response_model=ProposalPublic, responses=_NOT_FOUND)
async def get_proposal(
    proposal_id: IdPath, user: CurrentUser, gateway: GatewayDep
) -> ProposalPublic | JSONResponse:
    """One of my proposals, each file with its diff."""
    return _reply(await proposals_client.get_proposal(gateway, user.id, proposal_id))


@router.post("/{proposal_id}/approve", response_model=ProposalPublic, responses=_DECISION)
async def approve(
    proposal_id: IdPath, user: CurrentUser, gateway: GatewayDep, body: ApproveBody | None = None
) -> ProposalPublic | JSONResponse:
    """Apply one of my proposals, or only ``files`` of it (409 with the current diff if stale)."""
    result = await proposals_client.decide(gateway, user.id, proposal_id, "approve", body)
    return _reply(result)


@router.post("/{proposal_id}/reject", response_model=ProposalPublic, responses=_DECISION)
async def reject(
    proposal_id: IdPath, user: CurrentUser, gateway: GatewayDep, body: RejectBody | None = None
) -> ProposalPublic | JSONResponse:
    """Reject one of my proposals."""
    result = await proposals_client.decide(gateway, user.id, proposal_id, "reject", body)
    return _reply(result)


@router.post(
    "/{proposal_id}/revert", status_code=201, response_model=ProposalPublic, responses=_DECISION
)
async def revert(
    proposal_id: IdPath, user: CurrentUser, gateway: GatewayDep, body: RevertBody | None = None
) -> ProposalPublic | JSONResponse:
    """Propose undoing one of my applied proposals (or its turn's): a new pending proposal."""
    return _reply(await proposals_client.revert(gateway, user.id, proposal_id, body))
