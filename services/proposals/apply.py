"""Applying a proposal's file changes to a workspace: all-or-nothing, atomic per file.

Every file is checked first (confinement and compare-and-swap on its SHA-256) so a stale
proposal writes nothing. Each write goes to a temp file in the same directory, is fsynced
and renamed over the target; if a later file fails, the files already changed are restored.

A file already in its proposed state (same content, or already deleted) counts as done and
is not written again: a process killed half-way through an apply leaves every file old or
new, SQL still says pending, and approving again finishes the job instead of conflicting.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from services.proposals import faults
from shared.events import FileOperation
from shared.workspace_paths import PathOutsideWorkspace, resolve_in_workspace

TEMP_PREFIX = ".sb-apply-"  # temp files left by a crash are recognisable as ours
# Git runs hooks and fsmonitor commands named in .git/config: an agent must never write there.
FORBIDDEN_COMPONENTS = frozenset({".git"})


class ApplyError(Exception):
    """A proposal could not be applied; nothing in the workspace was changed."""


class PathRefused(ApplyError):
    """A file's path leaves the workspace (``..``, absolute, or through a symlink)."""


@dataclass(frozen=True)
class StaleFile:
    """A file whose content on disk no longer matches what the proposal was made against."""

    path: str
    reason: str
    current: str | None
    current_sha256: str | None


class StaleFiles(ApplyError):
    """One or more files changed since the proposal was made."""

    def __init__(self, stale: list[StaleFile]) -> None:
        super().__init__("files changed since proposed: " + ", ".join(s.path for s in stale))
        self.stale = stale


@dataclass(frozen=True)
class FileChange:
    """One file of a proposal, as the applier needs it."""

    path: str
    operation: FileOperation
    after: str | None
    before_sha256: str | None


def sha256_bytes(data: bytes) -> str:
    """The hex SHA-256 of ``data`` (``before_sha256`` is over the file's raw bytes)."""
    return hashlib.sha256(data).hexdigest()


def decode_text(data: bytes | None) -> str | None:
    """File bytes as text for display; undecodable bytes are replaced, never fatal."""
    return None if data is None else data.decode("utf-8", errors="replace")


def resolve(workspace: Path, relative: str) -> Path:
    """The target path of ``relative``, refused if it leaves ``workspace``."""
    try:
        target = resolve_in_workspace(workspace, relative)
    except PathOutsideWorkspace as exc:
        raise PathRefused(str(exc)) from None
    if target == workspace.resolve():
        raise PathRefused(f"expected a file path, got the workspace itself: {relative!r}")
    inside = target.relative_to(workspace.resolve())
    if any(part.lower() in FORBIDDEN_COMPONENTS for part in inside.parts):
        raise PathRefused(f"expected a path outside .git, got {relative!r}")
    return target


def read_bytes(target: Path) -> bytes | None:
    """The file's bytes, or None if it does not exist; a directory is refused."""
    if target.is_dir():
        raise PathRefused(f"expected a file, got a directory: {str(target)!r}")
    try:
        return target.read_bytes()
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise PathRefused(f"a parent of {str(target)!r} is not a directory") from None


def already_done(change: FileChange, current: bytes | None) -> bool:
    """True if the file is already as the change would leave it."""
    if change.operation == "delete":
        return current is None
    return current is not None and change.after is not None and current == change.after.encode()


def find_stale(workspace: Path, changes: Sequence[FileChange]) -> list[StaleFile]:
    """Files whose current state differs from what the proposal expects (create: absent)."""
    stale: list[StaleFile] = []
    for change in changes:
        current = read_bytes(resolve(workspace, change.path))
        current_sha = None if current is None else sha256_bytes(current)
        if already_done(change, current):
            reason = ""
        elif change.operation == "create":
            reason = "" if current is None else "file exists now"
        elif current is None:
            reason = "file no longer exists"
        elif current_sha != change.before_sha256:
            reason = "file changed since proposed"
        else:
            reason = ""
        if reason:
            stale.append(StaleFile(change.path, reason, decode_text(current), current_sha))
    return stale


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(target: Path, data: bytes) -> None:
    """Replace ``target`` with ``data``: temp file, fsync, rename, fsync the directory."""
    mode = target.stat().st_mode & 0o7777 if target.exists() else None
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=TEMP_PREFIX)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        faults.crash_point(faults.CRASH_BEFORE_RENAME)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(target.parent)


def delete_file(target: Path) -> None:
    """Remove ``target`` durably."""
    os.unlink(target)
    _fsync_dir(target.parent)


@dataclass
class Applied:
    """What ``apply_changes`` did, so that it can be undone if recording it fails."""

    previous: list[tuple[Path, bytes | None]] = field(default_factory=list)
    created_dirs: list[Path] = field(default_factory=list)

    def undo(self) -> None:
        """Put every changed file back as it was, newest first; remove directories we made."""
        for target, before in reversed(self.previous):
            if before is None:
                with contextlib.suppress(FileNotFoundError):
                    delete_file(target)
            else:
                write_atomic(target, before)
        for directory in reversed(self.created_dirs):
            with contextlib.suppress(OSError):  # not empty any more: someone else uses it
                directory.rmdir()
        self.previous.clear()
        self.created_dirs.clear()


def _make_parents(directory: Path, applied: Applied) -> None:
    missing: list[Path] = []
    while not directory.exists():
        missing.append(directory)
        directory = directory.parent
    for d in reversed(missing):
        d.mkdir()
        applied.created_dirs.append(d)


def apply_changes(workspace: Path, changes: Sequence[FileChange]) -> Applied:
    """Apply every change or none: ``StaleFiles``/``PathRefused`` before any write."""
    stale = find_stale(workspace, changes)
    if stale:
        raise StaleFiles(stale)
    applied = Applied()
    try:
        for change in changes:
            # Resolved again right before the write, so a symlink swapped in meanwhile is refused.
            target = resolve(workspace, change.path)
            before = read_bytes(target)
            if already_done(change, before):
                continue
            if change.operation == "delete":
                delete_file(target)
            else:
                if change.after is None:
                    raise ApplyError(f"expected content for {change.operation} of {change.path!r}")
                _make_parents(target.parent, applied)
                write_atomic(target, change.after.encode("utf-8"))
            applied.previous.append((target, before))
    except BaseException:
        applied.undo()
        raise
    return applied
