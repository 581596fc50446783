"""The user's workspaces and the one selected for new conversations."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel

from services.gateway import conversations
from services.gateway.conversations import checked_workspace
from services.gateway.deps import CurrentUser, GatewayDep

router = APIRouter(prefix="/api")


class WorkspaceName(BaseModel):
    """Body naming one workspace."""

    name: str


@router.get("/workspaces")
async def list_workspaces(user: CurrentUser, gateway: GatewayDep) -> dict[str, Any]:
    """My workspaces and the selected one."""
    return await gateway.db(lambda s: conversations.list_workspaces(s, user.id))


@router.post("/workspaces", status_code=201)
async def create_workspace(
    body: WorkspaceName, user: CurrentUser, gateway: GatewayDep
) -> dict[str, Any]:
    """Create a workspace (and its directory); creating an existing one is harmless."""
    name = checked_workspace(body.name)
    await gateway.db(lambda s: conversations.ensure_workspace(s, user.id, name))
    conversations.make_workspace_dir(gateway.settings.workspaces_root, user.id, name)
    return {"name": name}


@router.post("/workspace/select")
async def select_workspace(
    body: WorkspaceName, user: CurrentUser, gateway: GatewayDep
) -> dict[str, Any]:
    """Use an existing workspace for new conversations."""
    name = await gateway.db(lambda s: conversations.select_workspace(s, user.id, body.name))
    return {"name": name}


@router.get("/workspace/current")
async def current_workspace(user: CurrentUser, gateway: GatewayDep) -> dict[str, Any]:
    """The workspace new conversations use."""
    listing = await gateway.db(lambda s: conversations.list_workspaces(s, user.id))
    return {"name": listing["selected"]}
