"""The apply journal: what an approval is about to change, durable before the first rename.

A process killed half-way through an apply leaves some files new and some old while SQL
still says pending. Before it renames anything, the applier writes a journal: the proposal,
and for every file its path, a copy of its old content (or that it was absent) and the
hash of its new content. Whoever next holds the proposal's row lock (start-up recovery,
the sweep, or the next decision, see ``recovery.py``) reads it and either rolls every file
back (the apply never committed) or just drops it (it did).

Journals live in ``<workspaces root>/.sb-journal/<proposal id>.<nonce>/``: beside the
per-user directories, never inside a workspace, so an agent's tools cannot read or forge
one (user ids are ``user_<hex>``, workspace names never start with a dot). One directory
per apply: the backups ``old-<n>`` first, then ``journal.json``, each fsynced; a directory
without ``journal.json`` is an apply that never got as far as touching the workspace.

This module never touches a workspace itself: the roll-back (``apply.roll_back``) reaches
the journalled files through directory fds with ``O_NOFOLLOW``, as the apply did, so a
symlink the agent swapped in after a crash cannot turn a restore into a write elsewhere.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

JOURNAL_DIR = ".sb-journal"
RECORD = "journal.json"
FORMAT = 1
TEMP_PREFIX = ".sb-apply-"  # every temp file an apply makes starts with this, then the nonce


class JournalError(Exception):
    """A journal that cannot be read as one: names the directory."""


def journal_root(workspaces_root: Path) -> Path:
    """Where the journals of workspaces under ``workspaces_root`` are kept."""
    return workspaces_root.resolve() / JOURNAL_DIR


def fsync_dir(directory: Path) -> None:
    """Make a directory's entries (a rename, a new or removed file) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durable(path: Path, data: bytes) -> None:
    with open(path, "xb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


@dataclass(frozen=True)
class JournalFile:
    """One file an apply changes: where, its old content's backup (None: absent), new hash."""

    path: str
    backup: str | None
    old_sha256: str | None
    new_sha256: str | None  # None: the apply deletes it


@dataclass(frozen=True)
class PlannedFile:
    """What the applier tells the journal about one file before changing it."""

    path: str
    old: bytes | None
    old_sha256: str | None
    new_sha256: str | None


@dataclass(frozen=True)
class Journal:
    """One apply's journal, as written to (or read back from) its directory."""

    directory: Path
    proposal_id: str
    decided_id: str  # the row whose status 'applied' says the apply committed
    workspace: Path
    nonce: str
    files: tuple[JournalFile, ...]
    created_dirs: tuple[str, ...]  # relative to the workspace, outermost first

    @property
    def temp_prefix(self) -> str:
        """The name prefix of every temp file this apply (or its undo) makes."""
        return f"{TEMP_PREFIX}{self.nonce}-"

    def old_content(self, entry: JournalFile) -> bytes | None:
        """The backed-up old bytes of ``entry`` (None: it did not exist)."""
        return None if entry.backup is None else (self.directory / entry.backup).read_bytes()

    def discard(self) -> None:
        """Remove the journal (it is no longer needed, or already gone)."""
        remove(self.directory)


def remove(directory: Path) -> None:
    """Remove a journal directory durably; a missing one is fine (someone settled it)."""
    record = directory / RECORD
    # The record goes first: a crash mid-removal leaves an incomplete journal, read as none.
    with contextlib.suppress(FileNotFoundError):
        record.unlink()
        fsync_dir(directory)
    shutil.rmtree(directory, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        fsync_dir(directory.parent)


def begin(
    root: Path,
    proposal_id: str,
    decided_id: str,
    workspace: Path,
    files: Sequence[PlannedFile],
    created_dirs: Sequence[str],
) -> Journal:
    """Write and fsync a new journal; only after this returns may the workspace change."""
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    nonce = secrets.token_hex(6)
    directory = root / f"{proposal_id}.{nonce}"
    directory.mkdir(mode=0o700)
    entries: list[JournalFile] = []
    for n, planned in enumerate(files):
        backup = None
        if planned.old is not None:
            backup = f"old-{n}"
            _write_durable(directory / backup, planned.old)
        entries.append(JournalFile(planned.path, backup, planned.old_sha256, planned.new_sha256))
    journal = Journal(
        directory=directory,
        proposal_id=proposal_id,
        decided_id=decided_id,
        workspace=workspace.resolve(),
        nonce=nonce,
        files=tuple(entries),
        created_dirs=tuple(created_dirs),
    )
    record = {
        "format": FORMAT,
        "proposal_id": proposal_id,
        "decided_id": decided_id,
        "workspace": str(journal.workspace),
        "nonce": nonce,
        "created_dirs": list(created_dirs),
        "files": [
            {
                "path": e.path,
                "backup": e.backup,
                "old_sha256": e.old_sha256,
                "new_sha256": e.new_sha256,
            }
            for e in entries
        ],
    }
    # Written under a temp name and renamed: the record exists whole or not at all.
    partial = directory / f"{RECORD}.partial"
    _write_durable(partial, json.dumps(record).encode())
    os.replace(partial, directory / RECORD)
    fsync_dir(directory)
    fsync_dir(root)
    return journal


def read(directory: Path) -> Journal | None:
    """The journal in ``directory``; None if it is incomplete (the apply wrote nothing)."""
    try:
        raw: dict[str, Any] = json.loads((directory / RECORD).read_bytes())
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise JournalError(f"unreadable journal {str(directory)!r}: {exc}") from None
    if raw.get("format") != FORMAT:
        raise JournalError(f"expected journal format {FORMAT}, got {raw.get('format')!r}")
    try:
        return Journal(
            directory=directory,
            proposal_id=str(raw["proposal_id"]),
            decided_id=str(raw["decided_id"]),
            workspace=Path(raw["workspace"]),
            nonce=str(raw["nonce"]),
            files=tuple(
                JournalFile(f["path"], f["backup"], f["old_sha256"], f["new_sha256"])
                for f in raw["files"]
            ),
            created_dirs=tuple(raw["created_dirs"]),
        )
    except (KeyError, TypeError) as exc:
        raise JournalError(f"malformed journal {str(directory)!r}: {exc!r}") from None


def proposal_of(directory: Path) -> str:
    """The proposal id a journal directory's name carries."""
    return directory.name.partition(".")[0]


def find(root: Path, proposal_id: str | None = None) -> list[Path]:
    """Journal directories under ``root`` (of ``proposal_id`` only, if given)."""
    try:
        found = [d for d in root.iterdir() if d.is_dir() and not d.is_symlink()]
    except FileNotFoundError:
        return []
    if proposal_id is not None:
        found = [d for d in found if proposal_of(d) == proposal_id]
    return sorted(found)
