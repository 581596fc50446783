"""``/api/admin/...``: usage of every user, budgets, quotas, token revocation — admins only.

The role is checked by the router itself (``dependencies``), so a route added here later
cannot forget it: a user who is not an admin gets 403 ``forbidden`` from every one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field
from sqlalchemy.orm import Session

from signalbox.services.gateway import admin
from signalbox.services.gateway.budgets import BudgetReport, budget_report, set_budget
from signalbox.services.gateway.deps import GatewayDep, IdPath, admin_user
from signalbox.shared.admission import Limits
from signalbox.shared.gateway_api import GatewayErrorBody

_REFUSED: dict[int | str, dict[str, Any]] = {
    403: {"model": GatewayErrorBody, "description": "`forbidden`: the caller is not an admin"},
    404: {"model": GatewayErrorBody, "description": "no such user"},
}

router = APIRouter(prefix="/api/admin", dependencies=[Depends(admin_user)], responses=_REFUSED)


class BudgetChange(BaseModel):
    """A user's token budgets per UTC period; null (or left out): no budget for it."""

    day_tokens: int | None = Field(default=None, ge=0)
    month_tokens: int | None = Field(default=None, ge=0)


class TokensRevoked(BaseModel):
    """How many live tokens of the user were revoked."""

    user_id: str
    revoked: int


@router.get("/usage", response_model=list[admin.UserUsage])
async def all_usage(gateway: GatewayDep, since: datetime | None = None) -> list[admin.UserUsage]:
    """Every user's model usage (since ``since``) and budgets."""
    now = gateway.clock()
    return await gateway.db(lambda s: admin.all_usage(s, since, now))


@router.get("/users/{user_id}/budget", response_model=BudgetReport)
async def get_budget(user_id: IdPath, gateway: GatewayDep) -> BudgetReport:
    """A user's budgets and what the current periods used."""
    await gateway.db(lambda s: admin.quota_report(s, gateway.quotas, user_id))  # 404 if none
    return await budget_report(gateway, user_id)


@router.put("/users/{user_id}/budget", response_model=BudgetReport)
async def put_budget(user_id: IdPath, body: BudgetChange, gateway: GatewayDep) -> BudgetReport:
    """Set a user's token budgets (per UTC day and calendar month)."""

    def write(session: Session) -> None:
        set_budget(session, user_id, body.day_tokens, body.month_tokens)

    await gateway.db(write)
    return await budget_report(gateway, user_id)


@router.get("/users/{user_id}/quotas", response_model=admin.QuotaReport)
async def get_quotas(user_id: IdPath, gateway: GatewayDep) -> admin.QuotaReport:
    """A user's quotas and what they hold."""
    return await gateway.db(lambda s: admin.quota_report(s, gateway.quotas, user_id))


@router.put("/users/{user_id}/quotas", response_model=admin.QuotaReport)
async def put_quotas(
    user_id: IdPath, body: admin.QuotaChange, gateway: GatewayDep
) -> admin.QuotaReport:
    """Set a user's own quotas (fields left out: the deployment's)."""
    return await gateway.db(lambda s: admin.set_quotas(s, gateway.quotas, user_id, body))


@router.get("/users/{user_id}/share", response_model=admin.ShareReport)
async def get_share(user_id: IdPath, gateway: GatewayDep) -> admin.ShareReport:
    """A user's fair share of the deployment and their running and waiting turns."""
    limits, prefix = Limits.of(gateway.settings), gateway.settings.redis_prefix
    return await gateway.db(lambda s: admin.share_report(s, limits, prefix, user_id))


@router.put("/users/{user_id}/share", response_model=admin.ShareReport)
async def put_share(
    user_id: IdPath, body: admin.ShareChange, gateway: GatewayDep
) -> admin.ShareReport:
    """Set a user's turns running at once and weight (null: the deployment's, 1)."""
    limits, prefix = Limits.of(gateway.settings), gateway.settings.redis_prefix
    report = await gateway.db(lambda s: admin.set_share(s, limits, prefix, user_id, body))
    await gateway.admit_waiting_turns()  # a raised limit may let waiting turns start now
    return report


@router.post("/users/{user_id}/revoke-tokens", response_model=TokensRevoked)
async def revoke_tokens(user_id: IdPath, gateway: GatewayDep) -> TokensRevoked:
    """Revoke every token of a user (they are refused from the next request on)."""
    revoked = await gateway.db(lambda s: admin.revoke_user_tokens(s, user_id))
    return TokensRevoked(user_id=user_id, revoked=revoked)
