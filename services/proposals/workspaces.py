"""What the proposals service can tell about a user's workspace directory (for the gateway)."""

from __future__ import annotations

import re
from typing import Any

from services.proposals import git_info
from services.proposals.context import ServiceContext
from services.proposals.errors import BadProposal, NotFound
from shared.db import User
from shared.workspace_paths import check_workspace_name

# A user id becomes a directory name: nothing that could climb out of the workspaces root.
_USER_ID = re.compile(r"^[A-Za-z0-9_-]{1,40}$")


def workspace_status(ctx: ServiceContext, user_id: str, name: str) -> dict[str, Any]:
    """``{"name", "path_exists", "git": {"branch", "dirty"} | None}`` of one workspace."""
    if not _USER_ID.match(user_id):
        raise BadProposal(f"expected a user id of letters, digits, '_' and '-', got {user_id!r}")
    try:
        check_workspace_name(name)
    except ValueError as exc:
        raise BadProposal(str(exc)) from None
    with ctx.sessions() as session:
        if session.get(User, user_id) is None:
            raise NotFound(f"no user {user_id!r}")
    path = ctx.workspace(user_id, name)
    exists = path.is_dir()
    git = git_info.status(path) if exists else None
    return {
        "name": name,
        "path_exists": exists,
        "git": None if git is None else {"branch": git.branch, "dirty": git.dirty},
    }
