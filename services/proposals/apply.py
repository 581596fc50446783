"""Applying a proposal's file changes to a workspace: all-or-nothing, atomic per file.

Every file is checked first (confinement and compare-and-swap on its SHA-256) so a stale
proposal writes nothing. Each write goes to a temp file in the same directory, is fsynced
and renamed over the target; if a later file fails, the files already changed are restored.

A process killed half-way through leaves every file whole (old or new) but the set mixed,
while SQL still says pending. So a decision journals the old state first (``journal.py``)
and whoever next holds the proposal's lock rolls the files back (``roll_back``): the
workspace is then exactly as before the approval (``recovery.py``).

A file already in its proposed state (same content, or already deleted) counts as done and
is not written again.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import logging
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from services.proposals import faults, journal
from services.proposals.journal import (
    TEMP_PREFIX,
    Journal,
    JournalError,
    PlannedFile,
    fsync_dir,
)
from shared.events import FileOperation
from shared.workspace_paths import PathOutsideWorkspace, resolve_in_workspace

log = logging.getLogger(__name__)
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


def write_atomic(target: Path, data: bytes, prefix: str = TEMP_PREFIX) -> None:
    """Replace ``target`` with ``data``: temp file, fsync, rename, fsync the directory."""
    mode = target.stat().st_mode & 0o7777 if target.exists() else None
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=prefix)
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
    fsync_dir(target.parent)


def delete_file(target: Path) -> None:
    """Remove ``target`` durably."""
    os.unlink(target)
    fsync_dir(target.parent)


@dataclass(frozen=True)
class JournalSpec:
    """Journal the apply (``journal.py``): where, and which proposal and decided row."""

    root: Path
    proposal_id: str
    decided_id: str


@dataclass
class Applied:
    """What ``apply_changes`` did, so that it can be undone if recording it fails."""

    previous: list[tuple[Path, bytes | None]] = field(default_factory=list)
    created_dirs: list[Path] = field(default_factory=list)
    journal: Journal | None = None

    @property
    def temp_prefix(self) -> str:
        """Temp names of this apply: its journal lists them by this prefix."""
        return TEMP_PREFIX if self.journal is None else self.journal.temp_prefix

    def undo(self) -> None:
        """Put every changed file back as it was, newest first; remove directories we made."""
        for target, before in reversed(self.previous):
            if before is None:
                with contextlib.suppress(FileNotFoundError):
                    delete_file(target)
            else:
                write_atomic(target, before, prefix=self.temp_prefix)
        for directory in reversed(self.created_dirs):
            with contextlib.suppress(OSError):  # not empty any more: someone else uses it
                directory.rmdir()
        self.previous.clear()
        self.created_dirs.clear()
        self.finish()

    def finish(self) -> None:
        """The outcome is recorded (or undone): the journal is not needed any more."""
        if self.journal is not None:
            self.journal.discard()
            self.journal = None


def _missing_dirs(directory: Path) -> list[Path]:
    """The directories ``mkdir`` would have to make for ``directory``, outermost first."""
    missing: list[Path] = []
    while not directory.exists():
        missing.append(directory)
        directory = directory.parent
    return missing[::-1]


def _make_parents(directory: Path, applied: Applied) -> None:
    for d in _missing_dirs(directory):
        d.mkdir()
        applied.created_dirs.append(d)


@dataclass(frozen=True)
class _Step:
    change: FileChange
    target: Path
    before: bytes | None
    after: bytes | None  # None: delete


def _plan(workspace: Path, changes: Sequence[FileChange]) -> tuple[list[_Step], list[Path]]:
    """The writes still to do (files already as proposed are skipped) and dirs to make."""
    steps: list[_Step] = []
    new_dirs: list[Path] = []
    for change in changes:
        target = resolve(workspace, change.path)
        before = read_bytes(target)
        if already_done(change, before):
            continue
        after = None
        if change.operation != "delete":
            if change.after is None:
                raise ApplyError(f"expected content for {change.operation} of {change.path!r}")
            after = change.after.encode("utf-8")
            new_dirs += [d for d in _missing_dirs(target.parent) if d not in new_dirs]
        steps.append(_Step(change, target, before, after))
    return steps, new_dirs


def _begin_journal(
    spec: JournalSpec, workspace: Path, steps: list[_Step], dirs: list[Path]
) -> Journal:
    planned = [
        PlannedFile(
            path=s.change.path,
            old=s.before,
            old_sha256=None if s.before is None else sha256_bytes(s.before),
            new_sha256=None if s.after is None else sha256_bytes(s.after),
        )
        for s in steps
    ]
    base = workspace.resolve()
    relative = [str(d.relative_to(base)) for d in dirs]
    return journal.begin(spec.root, spec.proposal_id, spec.decided_id, workspace, planned, relative)


def apply_changes(
    workspace: Path, changes: Sequence[FileChange], journal_spec: JournalSpec | None = None
) -> Applied:
    """Apply every change or none: ``StaleFiles``/``PathRefused`` before any write.

    With ``journal_spec`` the old state is journalled (and fsynced) before the first write,
    so even a killed process can be rolled back (``roll_back``); the caller calls
    ``finish()`` once the outcome is committed, or ``undo()``.
    """
    stale = find_stale(workspace, changes)
    if stale:
        raise StaleFiles(stale)
    steps, new_dirs = _plan(workspace, changes)
    applied = Applied()
    if journal_spec is not None and steps:
        applied.journal = _begin_journal(journal_spec, workspace, steps, new_dirs)
    try:
        for step in steps:
            # Resolved again right before the write, so a symlink swapped in meanwhile is refused.
            if resolve(workspace, step.change.path) != step.target:
                raise PathRefused(f"{step.change.path!r} moved while it was being applied")
            if step.after is None:
                delete_file(step.target)
            else:
                _make_parents(step.target.parent, applied)
                write_atomic(step.target, step.after, prefix=applied.temp_prefix)
            applied.previous.append((step.target, step.before))
    except BaseException:
        applied.undo()
        raise
    return applied


def roll_back(record: Journal, workspaces_root: Path) -> list[str]:
    """Put the files of an apply that never committed back as they were; the paths restored.

    Only a file still holding the apply's new content is restored: one already old is
    left, and one changed by someone else since the crash is left too (and logged), so a
    human's later edit is never overwritten. Temp files of the apply are removed.
    """
    root = workspaces_root.resolve()
    workspace = record.workspace.resolve()
    if root not in workspace.parents:
        raise JournalError(f"expected a workspace under {str(root)!r}, got {str(workspace)!r}")
    restored: list[str] = []
    for entry in reversed(record.files):
        try:
            target = resolve(workspace, entry.path)
            current = read_bytes(target)
        except PathRefused as exc:
            log.warning("journal %s: not restoring %r: %s", record.directory.name, entry.path, exc)
            continue
        current_sha = None if current is None else sha256_bytes(current)
        if current_sha == entry.old_sha256:
            continue
        if current_sha != entry.new_sha256:
            log.warning(
                "journal %s: %r changed since the apply stopped; left as it is",
                record.directory.name,
                entry.path,
            )
            continue
        old = record.old_content(entry)
        if old is None:
            delete_file(target)
        else:
            _make_parents(target.parent, Applied())
            write_atomic(target, old, prefix=record.temp_prefix)
        restored.append(entry.path)
    _remove_temps(record, workspace)
    for relative in reversed(record.created_dirs):
        with contextlib.suppress(OSError, PathRefused):  # not empty: something else lives there
            resolve(workspace, relative).rmdir()
    return restored


def _remove_temps(record: Journal, workspace: Path) -> None:
    """Delete this apply's temp files: only in the directories of its files, by its prefix."""
    directories: set[Path] = set()
    for entry in record.files:
        with contextlib.suppress(PathRefused):
            directories.add(resolve(workspace, entry.path).parent)
    for directory in directories:
        for leftover in directory.glob(glob.escape(record.temp_prefix) + "*"):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
