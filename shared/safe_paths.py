"""Walking a relative path under a directory fd without ever following a symlink.

A path checked by name and then opened by name can be redirected in between: a directory
swapped for a symlink after the check sends the open wherever the link points. Opening each
component relative to its parent's fd with ``O_NOFOLLOW`` makes the check and the use one
act, so a symlink anywhere on the path fails the open instead of escaping. The tool
workers (reading, ``services/tools/confinement.py``) and the proposals service (writing,
``services/proposals/apply.py``) both walk paths this way.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class SymlinkInPath(OSError):
    """A component that must be a directory is a symlink (perhaps swapped in just now)."""


class NotRelative(ValueError):
    """A path a user or model gave that is not a clean path below the workspace."""


def relative_path(path: str) -> PurePosixPath:
    """``path`` as a clean relative path, or ``NotRelative`` naming it and why.

    The first check on any path from outside (the tools, the gateway's file browser): no
    NUL, not absolute (nor a backslash-rooted one), no ``..``. ``PurePosixPath`` drops ``.``
    and empty components, so ``./a//b/`` is ``a/b``.
    """
    if "\x00" in path:
        raise NotRelative(f"path contains a NUL byte: {path!r}")
    if path.startswith(("/", "\\")) or PurePosixPath(path).is_absolute():
        raise NotRelative(f"expected a path relative to the workspace, got {path!r}")
    pure = PurePosixPath(path)
    if ".." in pure.parts:
        raise NotRelative(f"'..' is not allowed in workspace paths, got {path!r}")
    return pure


def is_symlink_at(dir_fd: int, name: str) -> bool:
    """True if ``name`` in directory ``dir_fd`` is a symlink right now."""
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def open_root(directory: Path) -> int:
    """An fd of ``directory``, refused (``SymlinkInPath``) if its last component is a symlink."""
    try:
        return os.open(directory, DIR_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and directory.is_symlink()):
            raise SymlinkInPath(exc.errno, "is a symlink", str(directory)) from None
        raise


def open_dir_at(dir_fd: int, name: str) -> int:
    """An fd of directory ``name`` in ``dir_fd``: ``SymlinkInPath`` if it is a symlink.

    Any other failure is the ``OSError`` of the open (``ENOENT``, ``ENOTDIR`` for a file).
    """
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        # With O_NOFOLLOW a symlink fails as ELOOP, or as ENOTDIR since O_DIRECTORY is set.
        if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and is_symlink_at(dir_fd, name)):
            raise SymlinkInPath(exc.errno, "is a symlink", name) from None
        raise


def open_dirs_at(dir_fd: int, parts: Sequence[str]) -> int:
    """An fd of the directory ``parts`` under ``dir_fd`` (a new fd even for no parts).

    Raises like ``open_dir_at`` at the first component that fails; no fd is leaked.
    """
    fd = os.dup(dir_fd)
    for part in parts:
        try:
            nxt = open_dir_at(fd, part)
        finally:
            os.close(fd)
        fd = nxt
    return fd
