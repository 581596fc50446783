"""Git facts about a workspace (branch, dirty) and committing an applied proposal.

Only a workspace that is itself the top of a repository counts: the workspaces root may
live inside some other checkout, whose state is none of the user's business. Every git
call has a timeout, and runs with hooks and fsmonitor switched off, because both execute
commands named in the repository's own config.
"""

from __future__ import annotations

import logging
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from signalbox.shared.db import Proposal

log = logging.getLogger(__name__)

GIT_TIMEOUT_S = 5.0  # a status on a huge or network-mounted tree must not hang a request
SAFE_CONFIG = (
    "-c", "core.hooksPath=/dev/null",
    "-c", "core.fsmonitor=false",
    "-c", "core.untrackedCache=false",
)  # fmt: skip
COMMITTER = {
    "GIT_AUTHOR_NAME": "Signalbox",
    "GIT_AUTHOR_EMAIL": "signalbox@localhost",
    "GIT_COMMITTER_NAME": "Signalbox",
    "GIT_COMMITTER_EMAIL": "signalbox@localhost",
}


class GitError(RuntimeError):
    """A git command failed, timed out, or git is not installed."""


@dataclass(frozen=True)
class GitStatus:
    """The branch (None when detached) and whether the working tree has changes."""

    branch: str | None
    dirty: bool


def _git(workspace: Path, *args: str, env: dict[str, str] | None = None) -> str:
    command = ["git", *SAFE_CONFIG, "-C", str(workspace), *args]
    # An inherited GIT_DIR (say, from a hook that started us) would point git elsewhere.
    inherited = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE")}
    full_env = {**inherited, "GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0", **(env or {})}
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            env=full_env,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GitError(f"git {args[0]} in {str(workspace)!r} failed: {exc!r}") from None
    if done.returncode != 0:
        raise GitError(f"git {args[0]} in {str(workspace)!r}: {done.stderr.strip()!r}")
    return done.stdout


def is_repository(workspace: Path) -> bool:
    """True if ``workspace`` is the top directory of a git working tree."""
    if not (workspace / ".git").exists():
        return False  # cheap, and keeps a repository above the workspace out of the answer
    try:
        top = _git(workspace, "rev-parse", "--show-toplevel").strip()
    except GitError:
        return False
    return Path(top).resolve() == workspace.resolve()


def status(workspace: Path) -> GitStatus | None:
    """Branch and dirty state of ``workspace``, or None if it is not a git repository."""
    if not is_repository(workspace):
        return None
    try:
        branch: str | None = _git(workspace, "symbolic-ref", "--short", "-q", "HEAD").strip()
    except GitError:
        branch = None  # detached HEAD
    porcelain = _git(workspace, "status", "--porcelain", "--untracked-files=normal")
    return GitStatus(branch=branch or None, dirty=bool(porcelain.strip()))


def commit_applied(workspace: Path, proposal: Proposal) -> str | None:
    """Commit the files of an applied proposal, its summary as the message; the commit id.

    Best effort, after the decision is durable: a failure is logged, never undoes the apply.
    Only the proposal's own paths are staged, so unrelated edits of the human stay unstaged.
    """
    if not is_repository(workspace):
        return None
    paths = [f.path for f in proposal.files]
    message = (
        f"{proposal.summary.strip() or 'Signalbox proposal'}\n\n"
        f"Proposal: {proposal.id}\nApproved-by: {proposal.decided_by}\n"
    )
    try:
        _git(workspace, "add", "-A", "--", *paths)
        _git(workspace, "commit", "-q", "--no-verify", "-m", message, "--", *paths, env=COMMITTER)
        return _git(workspace, "rev-parse", "HEAD").strip()
    except GitError as exc:
        log.warning("could not commit proposal %s: %s", proposal.id, exc)
        return None
