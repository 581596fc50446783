"""``/api/webhooks``: the URLs I want events sent to, and how their deliveries went.

Owner-scoped: another user's webhook is 404, like one that does not exist. A URL that
resolves to a private, loopback or link-local address is 422 unless the deployment allows
it (``SIGNALBOX_WEBHOOK_ALLOW_PRIVATE``).
"""

from __future__ import annotations

from typing import Any

import anyio
from fastapi import APIRouter

from signalbox.services.gateway import webhooks
from signalbox.services.gateway.deps import CurrentUser, GatewayDep, IdPath
from signalbox.services.gateway.routes.interactions import REFUSALS
from signalbox.services.gateway.webhooks import (
    NewWebhook,
    WebhookCreated,
    WebhookDetail,
    WebhookView,
)
from signalbox.shared.gateway_api import GatewayErrorBody

router = APIRouter(prefix="/api/webhooks")

CREATE_REFUSALS: dict[int | str, dict[str, Any]] = {
    422: {"model": GatewayErrorBody, "description": "a URL webhooks are never sent to"},
}


@router.get("", response_model=list[WebhookView])
async def list_webhooks(user: CurrentUser, gateway: GatewayDep) -> list[WebhookView]:
    """My webhooks, each with its latest delivery."""
    return await gateway.db(lambda s: webhooks.list_webhooks(s, user.id))


@router.post("", status_code=201, response_model=WebhookCreated, responses=CREATE_REFUSALS)
async def create_webhook(
    body: NewWebhook, user: CurrentUser, gateway: GatewayDep
) -> WebhookCreated:
    """Register a URL for some event kinds; the answer shows the signing secret once."""
    allow = gateway.settings.webhook_allow_private
    await anyio.to_thread.run_sync(webhooks.check_url, body.url, allow)  # resolves DNS
    return await gateway.db(lambda s: webhooks.create(s, user.id, body))


@router.get("/{webhook_id}", response_model=WebhookDetail, responses=REFUSALS)
async def get_webhook(webhook_id: IdPath, user: CurrentUser, gateway: GatewayDep) -> WebhookDetail:
    """One of my webhooks with its recent deliveries (status, attempts, last answer)."""
    return await gateway.db(lambda s: webhooks.show(s, user.id, webhook_id))


@router.delete("/{webhook_id}", response_model=WebhookView, responses=REFUSALS)
async def delete_webhook(webhook_id: IdPath, user: CurrentUser, gateway: GatewayDep) -> WebhookView:
    """Remove one of my webhooks; what it still had queued is not sent."""
    return await gateway.db(lambda s: webhooks.delete(s, user.id, webhook_id))
