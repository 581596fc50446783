"""Where a user's workspace lives, and confinement of relative paths inside it.

Both the tool workers (read) and the proposals service (write) resolve paths here, so
the rules cannot drift: component-wise containment after resolving symlinks, so that
``/ws/user-evil`` is not inside ``/ws/user``.
"""

from __future__ import annotations

import re
from pathlib import Path

# Public so HTTP routes can type a path parameter with it (a 422 before any code runs).
WORKSPACE_NAME_MAX_CHARS = 100
WORKSPACE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
_WORKSPACE_NAME = re.compile(WORKSPACE_NAME_PATTERN)


class PathOutsideWorkspace(ValueError):
    """A path that would leave the workspace, or is not a usable relative path."""


def check_workspace_name(name: str) -> str:
    """Return ``name`` if it is a valid workspace name, else raise ``ValueError``."""
    if not _WORKSPACE_NAME.fullmatch(name):
        raise ValueError(
            f"expected a workspace name of letters, digits, '.', '_', '-', got {name!r}"
        )
    return name


def workspace_dir(root: Path, user_id: str, name: str) -> Path:
    """The directory of ``user_id``'s workspace ``name`` under ``root``."""
    return root.resolve() / user_id / check_workspace_name(name)


def resolve_in_workspace(workspace: Path, relative: str) -> Path:
    """The absolute path of ``relative`` inside ``workspace``, or ``PathOutsideWorkspace``."""
    if "\x00" in relative:
        raise PathOutsideWorkspace(f"path contains a NUL byte: {relative!r}")
    if relative.startswith(("/", "\\")) or Path(relative).is_absolute():
        raise PathOutsideWorkspace(f"expected a path relative to the workspace, got {relative!r}")
    base = workspace.resolve()
    candidate = (base / relative).resolve()
    if candidate != base and base not in candidate.parents:
        raise PathOutsideWorkspace(f"path leaves the workspace: {relative!r}")
    return candidate
