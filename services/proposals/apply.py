"""Applying a proposal's file changes to a workspace: all-or-nothing, atomic per file.

Every file is checked first (confinement and compare-and-swap on its SHA-256) so a stale
proposal writes nothing. Each write goes to a temp file in the same directory, is fsynced
and renamed over the target; if a later file fails, the files already changed are restored.

Every read, write, rename and unlink goes through directory fds walked with ``O_NOFOLLOW``
(``workspace_files.py``), opened once for the check and kept for the writes and any undo:
an agent swapping a directory for a symlink mid-apply gets a ``PathRefused`` (409, the
proposal becomes ``conflict``, nothing written), never a write outside its workspace.

A process killed half-way through leaves every file whole (old or new) but the set mixed,
while SQL still says pending. So a decision journals the old state first (``journal.py``)
and whoever next holds the proposal's lock rolls the files back (``roll_back``): the
workspace is then exactly as before the approval (``recovery.py``).

A file already in its proposed state (same content, or already deleted) counts as done and
is not written again.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from signalbox.services.proposals import journal
from signalbox.services.proposals.journal import TEMP_PREFIX, Journal, JournalError, PlannedFile
from signalbox.services.proposals.workspace_files import (
    ApplyError,
    Parts,
    PathRefused,
    Target,
    Tree,
    delete_file,
    locate,
    read,
    read_current,
    resolve,
    write_atomic,
)
from signalbox.shared.events import FileOperation

__all__ = [
    "Applied",
    "ApplyError",
    "FileChange",
    "JournalSpec",
    "PathRefused",
    "StaleFile",
    "StaleFiles",
    "Target",
    "apply_changes",
    "decode_text",
    "read_current",
    "resolve",
    "roll_back",
    "sha256_bytes",
    "write_atomic",
]

log = logging.getLogger(__name__)


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


def already_done(change: FileChange, current: bytes | None) -> bool:
    """True if the file is already as the change would leave it."""
    if change.operation == "delete":
        return current is None
    return current is not None and change.after is not None and current == change.after.encode()


def _stale_reason(change: FileChange, current: bytes | None) -> str:
    """Why ``change`` cannot apply to ``current`` (create: absent), or "" if it can."""
    if already_done(change, current):
        return ""
    if change.operation == "create":
        return "" if current is None else "file exists now"
    if current is None:
        return "file no longer exists"
    if sha256_bytes(current) != change.before_sha256:
        return "file changed since proposed"
    return ""


@dataclass(frozen=True)
class _Found:
    """A file as the check found it: where (None: a directory on its way is missing), bytes."""

    change: FileChange
    target: Target | None
    current: bytes | None


def _inspect(tree: Tree, changes: Sequence[FileChange]) -> list[_Found]:
    """Every file read through the tree; ``StaleFiles``/``PathRefused`` before any write."""
    found: list[_Found] = []
    stale: list[StaleFile] = []
    for change in changes:
        target = tree.target(change.path)
        current = None if target is None else read(target)
        found.append(_Found(change, target, current))
        reason = _stale_reason(change, current)
        if reason:
            current_sha = None if current is None else sha256_bytes(current)
            stale.append(StaleFile(change.path, reason, decode_text(current), current_sha))
    if stale:
        raise StaleFiles(stale)
    return found


@dataclass(frozen=True)
class JournalSpec:
    """Journal the apply (``journal.py``): where, and which proposal and decided row."""

    root: Path
    proposal_id: str
    decided_id: str


@dataclass
class Applied:
    """What ``apply_changes`` did, so that it can be undone if recording it fails.

    It holds the tree's directory fds until ``finish`` or ``undo``: an undo restores the
    files in the directories they were written in, even if their names were swapped since.
    """

    tree: Tree | None = None
    previous: list[tuple[Target, bytes | None]] = field(default_factory=list)
    created_dirs: list[Parts] = field(default_factory=list)
    journal: Journal | None = None

    @property
    def temp_prefix(self) -> str:
        """Temp names of this apply: its journal lists them by this prefix."""
        return TEMP_PREFIX if self.journal is None else self.journal.temp_prefix

    def undo(self) -> None:
        """Put every changed file back as it was, newest first; remove directories we made.

        If this fails half-way the journal stays, and recovery finishes the job.
        """
        try:
            for target, before in reversed(self.previous):
                if before is None:
                    with contextlib.suppress(FileNotFoundError):
                        delete_file(target)
                else:
                    write_atomic(target, before, prefix=self.temp_prefix)
            if self.tree is not None:
                for directory in reversed(self.created_dirs):
                    self.tree.remove_dir(directory)  # not empty any more: someone uses it
            self.previous.clear()
            self.created_dirs.clear()
        finally:
            self._close()
        self.finish()

    def finish(self) -> None:
        """The outcome is recorded (or undone): the journal is not needed any more."""
        self._close()
        if self.journal is not None:
            self.journal.discard()
            self.journal = None

    def _close(self) -> None:
        if self.tree is not None:
            self.tree.close()
            self.tree = None


@dataclass(frozen=True)
class _Step:
    change: FileChange
    target: Target | None  # None: its directory is made when the step runs
    before: bytes | None
    after: bytes | None  # None: delete


def _plan(tree: Tree, found: list[_Found]) -> tuple[list[_Step], list[Parts]]:
    """The writes still to do (files already as proposed are skipped) and dirs to make."""
    steps: list[_Step] = []
    new_dirs: list[Parts] = []
    for f in found:
        change = f.change
        if already_done(change, f.current):
            continue
        after = None
        if change.operation != "delete":
            if change.after is None:
                raise ApplyError(f"expected content for {change.operation} of {change.path!r}")
            after = change.after.encode("utf-8")
            if f.target is None:
                new_dirs += [d for d in tree.missing_dirs(change.path) if d not in new_dirs]
        steps.append(_Step(change, f.target, f.current, after))
    return steps, new_dirs


def _begin_journal(
    spec: JournalSpec, workspace: Path, steps: list[_Step], dirs: list[Parts]
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
    relative = ["/".join(d) for d in dirs]
    return journal.begin(spec.root, spec.proposal_id, spec.decided_id, workspace, planned, relative)


def apply_changes(
    workspace: Path, changes: Sequence[FileChange], journal_spec: JournalSpec | None = None
) -> Applied:
    """Apply every change or none: ``StaleFiles``/``PathRefused`` before any write.

    With ``journal_spec`` the old state is journalled (and fsynced) before the first write,
    so even a killed process can be rolled back (``roll_back``); the caller calls
    ``finish()`` once the outcome is committed, or ``undo()``.
    """
    tree = Tree.open(workspace, create=True)
    applied = Applied(tree=tree)  # owns the tree's fds from here on: undo or finish closes them
    try:
        found = _inspect(tree, changes)
        steps, new_dirs = _plan(tree, found)
        if journal_spec is not None and steps:
            applied.journal = _begin_journal(journal_spec, workspace, steps, new_dirs)
        for step in steps:
            target = step.target
            if step.after is None:
                assert target is not None  # a file to delete exists, so its directory does
                delete_file(target)
            else:
                if target is None:
                    target = tree.target(step.change.path, made=applied.created_dirs)
                    assert target is not None  # made, or PathRefused
                write_atomic(target, step.after, prefix=applied.temp_prefix)
            applied.previous.append((target, step.before))
    except BaseException:
        applied.undo()
        raise
    return applied


def roll_back(record: Journal, workspaces_root: Path) -> list[str]:
    """Put the files of an apply that never committed back as they were; the paths restored.

    Only a file still holding the apply's new content is restored: one already old is
    left, and one changed by someone else since the crash is left too (and logged), so a
    human's later edit is never overwritten. Temp files of the apply are removed. Like the
    apply, it reaches every file through directory fds: a symlink on the way is refused.
    """
    root = workspaces_root.resolve()
    workspace = record.workspace.resolve()
    if root not in workspace.parents:
        raise JournalError(f"expected a workspace under {str(root)!r}, got {str(workspace)!r}")
    try:
        tree = Tree.open(workspace)
    except (FileNotFoundError, PathRefused) as exc:
        log.warning("journal %s: workspace not rolled back: %s", record.directory.name, exc)
        return []
    restored: list[str] = []
    with tree:
        for entry in reversed(record.files):
            try:
                if _restore(tree, record, entry):
                    restored.append(entry.path)
            except PathRefused as exc:
                log.warning(
                    "journal %s: not restoring %r: %s", record.directory.name, entry.path, exc
                )
        for entry in record.files:
            tree.remove_temps(entry.path, record.temp_prefix)
        for relative in reversed(record.created_dirs):
            with contextlib.suppress(PathRefused):  # gone, or not a plain directory any more
                parts, name = locate(tree.workspace, relative)
                tree.remove_dir((*parts, name))
    return restored


def _restore(tree: Tree, record: Journal, entry: journal.JournalFile) -> bool:
    """Put ``entry`` back to its old content if it still holds the new; True if it did."""
    target = tree.target(entry.path)
    current = None if target is None else read(target)
    current_sha = None if current is None else sha256_bytes(current)
    if current_sha == entry.old_sha256:
        return False
    if current_sha != entry.new_sha256:
        log.warning(
            "journal %s: %r changed since the apply stopped; left as it is",
            record.directory.name,
            entry.path,
        )
        return False
    old = record.old_content(entry)
    if old is None:
        assert target is not None  # it holds the new content, so it exists
        delete_file(target)
    else:
        if target is None:
            target = tree.target(entry.path, made=[])
            assert target is not None
        write_atomic(target, old, prefix=record.temp_prefix)
    return True
