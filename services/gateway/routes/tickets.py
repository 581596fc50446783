"""``POST /api/ws-tickets``."""

from __future__ import annotations

from fastapi import APIRouter

from signalbox.services.gateway.deps import CurrentUser, GatewayDep
from signalbox.services.gateway.tickets import TICKET_TTL_S, issue_ticket
from signalbox.shared.gateway_api import WsTicket

router = APIRouter()


@router.post("/api/ws-tickets", response_model=WsTicket)
async def create_ticket(user: CurrentUser, gateway: GatewayDep) -> WsTicket:
    """A single-use ticket for ``GET /ws?ticket=...`` (browsers cannot send headers there)."""
    ticket = await issue_ticket(gateway.redis, gateway.keys, user.id)
    return WsTicket(ticket=ticket, expires_in_s=TICKET_TTL_S)
