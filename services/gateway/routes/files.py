"""Read-only file browsing of the user's own workspace (``workspace_files.py``)."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Path, Query

from signalbox.services.gateway import workspace_files
from signalbox.services.gateway.deps import CurrentUser, GatewayDep
from signalbox.shared.workspace_paths import WORKSPACE_NAME_MAX_CHARS, WORKSPACE_NAME_PATTERN

router = APIRouter(prefix="/api/workspaces/{name}")

MAX_PATH_CHARS = 4096  # PATH_MAX: no longer path names anything

WorkspaceName = Annotated[
    str, Path(pattern=WORKSPACE_NAME_PATTERN, max_length=WORKSPACE_NAME_MAX_CHARS)
]
RelativePath = Annotated[str, Query(max_length=MAX_PATH_CHARS)]


@router.get("/files", response_model=workspace_files.DirListing)
async def list_files(
    name: WorkspaceName, user: CurrentUser, gateway: GatewayDep, path: RelativePath = "."
) -> workspace_files.DirListing:
    """The entries of a directory of my workspace ``name`` (symlinks listed, never followed)."""
    root = gateway.settings.workspaces_root
    return await asyncio.to_thread(workspace_files.list_files, root, user.id, name, path)


@router.get("/file", response_model=workspace_files.FileContent)
async def read_file(
    name: WorkspaceName, user: CurrentUser, gateway: GatewayDep, path: RelativePath
) -> workspace_files.FileContent:
    """A file of my workspace ``name``: its text (up to 512 KiB), or ``binary``."""
    root = gateway.settings.workspaces_root
    return await asyncio.to_thread(workspace_files.read_file, root, user.id, name, path)
