"""Calls to the proposals service on behalf of a user (internal token + X-Signalbox-User)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from signalbox.services.gateway.errors import BadInput, Conflict, NotFound, Unavailable
from signalbox.services.gateway.state import Gateway
from signalbox.shared.ids import is_id
from signalbox.shared.proposals_api import (
    DECIDED_MAX_LIMIT,
    ApproveBody,
    DecidedProposals,
    PendingProposals,
    ProposalPublic,
    RejectBody,
    RejectedAll,
    RevertBody,
    WorkspaceStatus,
)
from signalbox.shared.workspace_paths import check_workspace_name

log = logging.getLogger(__name__)

Decision = Literal["approve", "reject"]
Action = Literal["approve", "reject", "revert"]
M = TypeVar("M", bound=BaseModel)

# The refusals of the public routes, passed to the client as the service wrote them (a 409
# carries the current diff). Anything else unexpected is the service failing: 503.
PASSED_ON = frozenset({404, 409, 422})


@dataclass(frozen=True)
class Refused:
    """A 404, 409 or 422 of the proposals service, with its JSON body."""

    status_code: int
    body: Any


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])
    return str(body)[:500]


def _proposal_url(proposal_id: str, decision: Action | None = None) -> str:
    """The upstream URL of one proposal, built from a checked id and a fixed word only.

    The routes type their path parameter already; this check holds for every other caller
    (the WebSocket's ``decide_proposal``), so no text of a user's can ever reach an upstream
    path, where ``..`` or an escape would climb to the internal routes.
    """
    if not is_id(proposal_id):
        raise NotFound(f"proposal {proposal_id!r} not found")
    return f"/api/proposals/{proposal_id}" + (f"/{decision}" if decision else "")


async def _call(
    gateway: Gateway, user_id: str, method: str, url: str, body: BaseModel | None = None
) -> httpx.Response:
    content = None if body is None else body.model_dump_json().encode()
    headers = gateway.internal_headers(user_id)
    if content is not None:
        headers["Content-Type"] = "application/json"
    try:
        return await gateway.http.request(method, url, content=content, headers=headers)
    except httpx.HTTPError as exc:
        raise Unavailable(f"proposals service did not answer: {exc!r}") from exc


def _answer(response: httpx.Response, model: type[M], success: int = 200) -> M | Refused:
    """``model`` of a ``success``; a ``Refused`` to pass on; ``Unavailable`` for anything else."""
    if response.status_code in PASSED_ON:
        try:
            return Refused(response.status_code, response.json())
        except ValueError:
            return Refused(response.status_code, {"detail": response.text[:500]})
    if response.status_code != success:
        raise Unavailable(f"proposals service answered {response.status_code}: {_detail(response)}")
    try:
        return model.model_validate_json(response.content)
    except ValidationError as exc:
        raise Unavailable(f"proposals service answered an unexpected body: {exc}") from None


async def pending(gateway: Gateway, user_id: str) -> PendingProposals | Refused:
    """``user_id``'s pending proposals, oldest first."""
    response = await _call(gateway, user_id, "GET", "/api/proposals/pending")
    return _answer(response, PendingProposals)


async def decided(gateway: Gateway, user_id: str, limit: int) -> DecidedProposals | Refused:
    """``user_id``'s ``limit`` most recently decided proposals, newest first."""
    if not 1 <= limit <= DECIDED_MAX_LIMIT:  # the route checks it; this holds for any caller
        raise BadInput(f"expected a limit from 1 to {DECIDED_MAX_LIMIT}, got {limit!r}")
    url = f"/api/proposals/decided?limit={limit:d}"
    return _answer(await _call(gateway, user_id, "GET", url), DecidedProposals)


async def revert(
    gateway: Gateway, user_id: str, proposal_id: str, body: RevertBody | None
) -> ProposalPublic | Refused:
    """Propose undoing an applied proposal (or its turn's): 201 with the new proposal."""
    response = await _call(gateway, user_id, "POST", _proposal_url(proposal_id, "revert"), body)
    return _answer(response, ProposalPublic, success=201)


async def reject_all(
    gateway: Gateway, user_id: str, body: RejectBody | None
) -> RejectedAll | Refused:
    """Reject every pending proposal of ``user_id``."""
    response = await _call(gateway, user_id, "DELETE", "/api/proposals/all", body)
    return _answer(response, RejectedAll)


async def get_proposal(
    gateway: Gateway, user_id: str, proposal_id: str
) -> ProposalPublic | Refused:
    """One of ``user_id``'s proposals, each file with its diff."""
    response = await _call(gateway, user_id, "GET", _proposal_url(proposal_id))
    return _answer(response, ProposalPublic)


async def decide(
    gateway: Gateway,
    user_id: str,
    proposal_id: str,
    decision: Decision,
    body: ApproveBody | RejectBody | None = None,
) -> ProposalPublic | Refused:
    """Approve (``ApproveBody``: some files only) or reject (``RejectBody``) a proposal."""
    url = _proposal_url(proposal_id, decision)
    response = await _call(gateway, user_id, "POST", url, body)
    return _answer(response, ProposalPublic)


async def decide_proposal(
    gateway: Gateway,
    user_id: str,
    proposal_id: str,
    decision: Decision,
    reason: str | None = None,
) -> dict[str, Any]:
    """Approve or reject; the proposal JSON with its new ``status`` (the WebSocket's way).

    404 → ``NotFound``; 409 (a file changed since it was proposed) → ``Conflict``, because
    the approval did not happen; 422 → ``BadInput``; anything else → ``Unavailable``.
    """
    body: RejectBody | None = None
    if decision == "reject":
        try:
            body = RejectBody(reason=reason)
        except ValidationError as exc:
            raise BadInput(f"reason: {exc.errors()[0]['msg']}") from None
    result = await decide(gateway, user_id, proposal_id, decision, body)
    if isinstance(result, ProposalPublic):
        return result.model_dump()
    detail = result.body.get("detail") if isinstance(result.body, dict) else result.body
    if result.status_code == 404:
        raise NotFound(f"proposal {proposal_id!r} not found")
    if result.status_code == 409:
        raise Conflict(f"proposal {proposal_id!r}: {detail}")
    raise BadInput(f"proposal {proposal_id!r}: {detail}")


WORKSPACE_STATUS_TIMEOUT_S = 10.0  # the proposals service bounds each git call at 5 s


async def workspace_status(gateway: Gateway, user_id: str, name: str) -> dict[str, Any] | None:
    """``{"name", "path_exists", "git"}`` of a workspace, or None if the service cannot say."""
    if not is_id(user_id):
        return None
    try:
        check_workspace_name(name)  # a directory name of the user's: never a path upstream
    except ValueError:
        return None
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
    try:
        return WorkspaceStatus.model_validate_json(response.content).model_dump()
    except ValidationError as exc:
        log.warning("workspace status of %s/%s: unexpected body: %s", user_id, name, exc)
        return None
