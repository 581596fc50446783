"""Who the bearer token belongs to: the web UI shows it and tells "token rejected" apart."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from signalbox.services.gateway.admin import QuotaReport, quota_report
from signalbox.services.gateway.budgets import BudgetReport, budget_report
from signalbox.services.gateway.deps import CurrentUser, GatewayDep

router = APIRouter(prefix="/api/me")


class Me(BaseModel):
    """The authenticated user."""

    user_id: str
    name: str
    selected_workspace: str
    is_admin: bool = False  # (added) may call /api/admin/...


@router.get("", response_model=Me)
async def me(user: CurrentUser) -> Me:
    """The user of this token (401 when the token is missing, wrong or revoked)."""
    return Me(
        user_id=user.id,
        name=user.name,
        selected_workspace=user.selected_workspace,
        is_admin=user.is_admin,
    )


@router.get("/budget", response_model=BudgetReport)
async def my_budget(user: CurrentUser, gateway: GatewayDep) -> BudgetReport:
    """My token budgets and what the current periods used (empty: none set)."""
    return await budget_report(gateway, user.id)


@router.get("/quotas", response_model=QuotaReport)
async def my_quotas(user: CurrentUser, gateway: GatewayDep) -> QuotaReport:
    """My quotas on stored things and what I hold."""
    return await gateway.db(lambda s: quota_report(s, gateway.quotas, user.id))
