"""The user's workspaces and the one selected for new conversations."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

from signalbox.services.gateway import workspaces
from signalbox.services.gateway.deps import CurrentUser, GatewayDep
from signalbox.shared.gateway_api import SelectedWorkspace, Workspace, Workspaces
from signalbox.shared.protocol import MAX_ID_CHARS

router = APIRouter(prefix="/api")


class WorkspaceName(BaseModel):
    """Body naming one workspace."""

    name: str = Field(max_length=MAX_ID_CHARS)  # a valid name is at most 100 characters


@router.get("/workspaces", response_model=Workspaces)
async def list_workspaces(user: CurrentUser, gateway: GatewayDep) -> Workspaces:
    """My workspaces, each with its git info, and the selected one."""
    return Workspaces.model_validate(await workspaces.list_workspaces(gateway, user.id))


@router.post("/workspaces", status_code=201, response_model=Workspace)
async def create_workspace(
    body: WorkspaceName, user: CurrentUser, gateway: GatewayDep
) -> Workspace:
    """Create a workspace (and its directory); creating an existing one is harmless."""
    return Workspace.model_validate(await workspaces.create_workspace(gateway, user.id, body.name))


@router.post("/workspace/select", response_model=SelectedWorkspace)
async def select_workspace(
    body: WorkspaceName, user: CurrentUser, gateway: GatewayDep
) -> SelectedWorkspace:
    """Use one of my workspaces for new conversations (404 if I have none of that name)."""
    root = gateway.settings.workspaces_root
    name = await gateway.db(lambda s: workspaces.select_workspace(s, user.id, root, body.name))
    return SelectedWorkspace(name=name)


@router.get("/workspace/current", response_model=Workspace)
async def current_workspace(user: CurrentUser, gateway: GatewayDep) -> Workspace:
    """The workspace new conversations use, with its git info."""
    return Workspace.model_validate(await workspaces.current_workspace(gateway, user.id))
