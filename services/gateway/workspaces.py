"""A user's workspaces: which exist, which is selected, and what git says about each.

A user's workspaces are the rows of the Workspace table, the directories under
``workspaces_root/<user_id>`` (one made by hand, or by an older version, still counts),
and ``default``, which every user has. Git facts come from the proposals service, the one
service that owns the workspace files; the listing still answers when it does not.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from signalbox.services.gateway import proposals_client
from signalbox.services.gateway.errors import BadInput, NotFound
from signalbox.services.gateway.state import Gateway
from signalbox.shared.db import User, Workspace
from signalbox.shared.db.concurrency import insert_if_missing
from signalbox.shared.ids import new_id
from signalbox.shared.workspace_paths import check_workspace_name, workspace_dir

DEFAULT_WORKSPACE = "default"  # every user has it (users.selected_workspace starts there)


def checked_workspace(name: str) -> str:
    """``name`` if it is a valid workspace name, else ``BadInput`` naming it."""
    try:
        return check_workspace_name(name)
    except ValueError as exc:
        raise BadInput(str(exc)) from None


def ensure_workspace(session: Session, user_id: str, name: str) -> None:
    """Create the user's workspace row ``name`` if missing.

    Insert-if-missing on the (user, name) unique key: a new user's first sends, arriving at
    once on several sockets, all create ``default``, and there must be one row.
    """
    values = {"id": new_id("ws"), "user_id": user_id, "name": checked_workspace(name)}
    insert_if_missing(session, Workspace, values, key=("user_id", "name"))


def make_workspace_dir(root: Path, user_id: str, name: str) -> Path:
    """Create the workspace directory if missing (the proposals service writes into it)."""
    path = workspace_dir(root, user_id, name)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _valid(name: str) -> bool:
    try:
        check_workspace_name(name)
    except ValueError:
        return False
    return True


def directories(root: Path, user_id: str) -> list[str]:
    """Names of the workspace directories of ``user_id`` on disk (symlinks are not theirs)."""
    base = root.resolve() / user_id
    if not base.is_dir():
        return []
    return sorted(
        p.name for p in base.iterdir() if _valid(p.name) and p.is_dir() and not p.is_symlink()
    )


def _user(session: Session, user_id: str) -> User:
    user = session.get(User, user_id)
    if user is None:
        raise NotFound(f"user {user_id!r} not found")
    return user


def workspace_names(session: Session, user_id: str, root: Path) -> tuple[list[str], str]:
    """(every workspace name of the user, sorted; the selected one)."""
    user = _user(session, user_id)
    names = set(session.scalars(select(Workspace.name).where(Workspace.user_id == user_id)).all())
    names.update(directories(root, user_id))
    names.update({DEFAULT_WORKSPACE, user.selected_workspace})
    return sorted(names), user.selected_workspace


def select_workspace(session: Session, user_id: str, root: Path, name: str) -> str:
    """Make ``name`` (one of the user's workspaces) the one new conversations use."""
    names, _selected = workspace_names(session, user_id, root)
    if name not in names:
        raise NotFound(f"workspace {name!r} not found")
    ensure_workspace(session, user_id, name)  # a directory-only workspace gets its row
    _user(session, user_id).selected_workspace = name
    return name


async def workspace_info(
    gateway: Gateway, user_id: str, name: str, selected: bool
) -> dict[str, Any]:
    """``{"name", "selected", "path_exists", "git", "git_checked"}`` of one workspace.

    ``git_checked`` is False when the proposals service did not answer: ``git`` is then
    unknown (null) and ``path_exists`` is the gateway's own look at the directory.
    """
    status = await proposals_client.workspace_status(gateway, user_id, name)
    if status is None:
        path = workspace_dir(gateway.settings.workspaces_root, user_id, name)
        exists = await asyncio.to_thread(path.is_dir)
        return {
            "name": name,
            "selected": selected,
            "path_exists": exists,
            "git": None,
            "git_checked": False,
        }
    return {
        "name": name,
        "selected": selected,
        "path_exists": bool(status.get("path_exists")),
        "git": status.get("git"),
        "git_checked": True,
    }


async def list_workspaces(gateway: Gateway, user_id: str) -> dict[str, Any]:
    """The user's workspaces (each with its git info) and the selected one."""
    root = gateway.settings.workspaces_root
    names, selected = await gateway.db(lambda s: workspace_names(s, user_id, root))
    infos = await asyncio.gather(
        *(workspace_info(gateway, user_id, n, n == selected) for n in names)
    )
    return {"workspaces": list(infos), "selected": selected}


async def current_workspace(gateway: Gateway, user_id: str) -> dict[str, Any]:
    """The workspace new conversations use, with its git info."""
    root = gateway.settings.workspaces_root
    _names, selected = await gateway.db(lambda s: workspace_names(s, user_id, root))
    return await workspace_info(gateway, user_id, selected, True)


async def create_workspace(gateway: Gateway, user_id: str, name: str) -> dict[str, Any]:
    """Create a workspace (row and directory); creating an existing one is harmless."""
    name = checked_workspace(name)

    def create(session: Session) -> bool:
        gateway.quotas.reserve_workspace(session, user_id, name)
        ensure_workspace(session, user_id, name)
        return _user(session, user_id).selected_workspace == name

    selected = await gateway.db(create)
    make_workspace_dir(gateway.settings.workspaces_root, user_id, name)
    return await workspace_info(gateway, user_id, name, selected)
