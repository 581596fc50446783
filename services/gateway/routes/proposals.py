"""``/api/proposals/...`` passed through to the proposals service, acting for the caller."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from services.gateway import proposals_client
from services.gateway.deps import CurrentUser, GatewayDep

router = APIRouter()


@router.api_route("/api/proposals/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
async def proxy(path: str, request: Request, user: CurrentUser, gateway: GatewayDep) -> Response:
    """Forward method, query and body; return the proposals service's status and body."""
    upstream = await proposals_client.forward(
        gateway,
        user.id,
        request.method,
        path,
        request.url.query.encode(),
        await request.body(),
        request.headers.get("content-type"),
    )
    return Response(
        content=upstream.content,
        status_code=upstream.status_code,
        headers=proposals_client.response_headers(upstream),
    )
