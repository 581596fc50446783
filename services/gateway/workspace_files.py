"""Read-only look into a user's own workspace: list a directory, read a file.

The same confinement as the tools (``services/tools/confinement.py``): a path is refused by
name first (NUL, absolute, ``..``), then opened by walking it one component at a time from
the workspace's directory fd with ``O_NOFOLLOW`` (``shared/safe_paths.py``), so a symlink
anywhere on the way fails the request instead of leading outside. Symlinks are listed as
such and never followed. The workspace is ``workspaces_root/<user_id>/<name>``: another
user's is not reachable by any name.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import BaseModel

from signalbox.services.gateway.errors import BadInput, NotFound
from signalbox.shared.safe_paths import (
    NotRelative,
    SymlinkInPath,
    open_dirs_at,
    open_root,
    relative_path,
)
from signalbox.shared.workspace_paths import workspace_dir

MAX_ENTRIES = 2000  # a directory listing stops here (``truncated``)
MAX_READ_BYTES = 512 * 1024  # a file view shows at most this much (``truncated``)
HIDDEN = frozenset({".git"})  # version-control internals are not workspace content
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

EntryKind = Literal["file", "dir", "symlink", "other"]


class FileEntry(BaseModel):
    """One entry of a directory listing."""

    name: str
    path: str
    kind: EntryKind
    size: int | None


class DirListing(BaseModel):
    """``GET /api/workspaces/{name}/files``."""

    workspace: str
    path: str
    entries: list[FileEntry]
    truncated: bool


class FileContent(BaseModel):
    """``GET /api/workspaces/{name}/file``: UTF-8 text, or ``binary`` with no text."""

    workspace: str
    path: str
    size: int
    binary: bool
    text: str | None
    truncated: bool


def _relative(path: str) -> PurePosixPath:
    try:
        relative = relative_path(path)
    except NotRelative as exc:
        raise BadInput(str(exc)) from None
    # Hidden from listings, so not there by name either (in any case: a case-insensitive
    # filesystem would serve .GIT/config as .git/config).
    if any(part.lower() in HIDDEN for part in relative.parts):
        raise NotFound(f"no such file or directory: {path!r}")
    return relative


def _refused(exc: OSError, path: str) -> Exception:
    if isinstance(exc, SymlinkInPath) or exc.errno == errno.ELOOP:
        return BadInput(f"path is or passes through a symlink, which is not followed: {path!r}")
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return NotFound(f"no such directory or file in the workspace: {path!r}")
    return BadInput(f"cannot open {path!r}: {exc.strerror}")


@contextmanager
def _directory(base: Path, parts: tuple[str, ...], given: str) -> Iterator[int]:
    """An fd of directory ``parts`` under ``base``, never following a symlink."""
    try:
        root = open_root(base)
    except OSError as exc:
        raise (
            NotFound("no such workspace") if exc.errno == errno.ENOENT else _refused(exc, given)
        ) from None
    try:
        fd = open_dirs_at(root, parts)
    except OSError as exc:
        raise _refused(exc, given) from None
    finally:
        os.close(root)
    try:
        yield fd
    finally:
        os.close(fd)


def _kind(mode: int) -> EntryKind:
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "dir"
    return "file" if stat.S_ISREG(mode) else "other"


def list_files(root: Path, user_id: str, workspace: str, path: str) -> DirListing:
    """The entries of directory ``path`` (directories first, then by name)."""
    relative = _relative(path)
    entries: list[FileEntry] = []
    truncated = False
    with _directory(workspace_dir(root, user_id, workspace), relative.parts, path) as fd:
        for name in sorted(os.listdir(fd)):
            if name.lower() in HIDDEN:
                continue
            if len(entries) >= MAX_ENTRIES:
                truncated = True
                break
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue  # gone since the listing
            kind = _kind(st.st_mode)
            entries.append(
                FileEntry(
                    name=name,
                    path=str(relative / name),
                    kind=kind,
                    size=st.st_size if kind == "file" else None,
                )
            )
    entries.sort(key=lambda e: (e.kind != "dir", e.name))
    shown = str(relative) if relative.parts else "."
    return DirListing(workspace=workspace, path=shown, entries=entries, truncated=truncated)


def read_file(root: Path, user_id: str, workspace: str, path: str) -> FileContent:
    """The first ``MAX_READ_BYTES`` of regular file ``path``."""
    relative = _relative(path)
    if not relative.parts:
        raise BadInput("expected a file, got the workspace directory")
    with _directory(workspace_dir(root, user_id, workspace), relative.parts[:-1], path) as parent:
        try:
            fd = os.open(relative.name, _FILE_FLAGS, dir_fd=parent)
        except OSError as exc:
            raise _refused(exc, path) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise BadInput(f"expected a regular file, got something else: {path!r}")
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(MAX_READ_BYTES + 1)
    truncated = len(data) > MAX_READ_BYTES
    data = data[:MAX_READ_BYTES]
    try:
        text: str | None = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        cut_mid_character = truncated and exc.start > len(data) - 4  # still text
        text = data[: exc.start].decode("utf-8") if cut_mid_character else None
    return FileContent(
        workspace=workspace,
        path=str(relative),
        size=st.st_size,
        binary=text is None,
        text=text,
        truncated=truncated,
    )
