"""``POST /api/ws-tickets``."""

from __future__ import annotations

from fastapi import APIRouter

from services.gateway.deps import CurrentUser, GatewayDep
from services.gateway.tickets import TICKET_TTL_S, issue_ticket

router = APIRouter()


@router.post("/api/ws-tickets")
async def create_ticket(user: CurrentUser, gateway: GatewayDep) -> dict[str, str | int]:
    """A single-use ticket for ``GET /ws?ticket=...`` (browsers cannot send headers there)."""
    ticket = await issue_ticket(gateway.redis, gateway.keys, user.id)
    return {"ticket": ticket, "expires_in_s": TICKET_TTL_S}
