"""What the proposals service can tell about a user's workspace directory (for the gateway)."""

from __future__ import annotations

from typing import Any

from signalbox.services.proposals import git_info
from signalbox.services.proposals.context import ServiceContext
from signalbox.services.proposals.errors import BadProposal
from signalbox.services.proposals.ownership import known_user
from signalbox.shared.ids import is_id
from signalbox.shared.workspace_paths import check_workspace_name


def workspace_status(ctx: ServiceContext, user_id: str, name: str) -> dict[str, Any]:
    """``{"name", "path_exists", "git": {"branch", "dirty"} | None}`` of one workspace."""
    # The route's path types check both already; a direct caller gets the same rules, as a
    # user id and a workspace name become directory names.
    if not is_id(user_id):
        raise BadProposal(f"expected a user id of letters, digits, '_' and '-', got {user_id!r}")
    try:
        check_workspace_name(name)
    except ValueError as exc:
        raise BadProposal(str(exc)) from None
    with ctx.sessions() as session:
        known_user(session, user_id)
    path = ctx.workspace(user_id, name)
    exists = path.is_dir()
    git = git_info.status(path) if exists else None
    return {
        "name": name,
        "path_exists": exists,
        "git": None if git is None else {"branch": git.branch, "dirty": git.dirty},
    }
