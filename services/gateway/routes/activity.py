"""``GET /api/activity``: the conversation list's last-activity times and waiting badges."""

from __future__ import annotations

from fastapi import APIRouter

from signalbox.services.gateway import activity as activity_
from signalbox.services.gateway.deps import CurrentUser, GatewayDep

router = APIRouter(prefix="/api/activity")


@router.get("", response_model=activity_.Activity)
async def activity(user: CurrentUser, gateway: GatewayDep) -> activity_.Activity:
    """Per conversation: last activity, the running root turn, decisions and questions waiting."""
    return await gateway.db(lambda s: activity_.activity(s, user.id))
