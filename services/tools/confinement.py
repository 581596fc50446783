"""Confinement of tool paths to the workspace, checked by name and enforced again when opening.

Two steps, so a symlink inside the workspace still works while nothing outside is reachable:

1. ``confine`` refuses what is never a workspace path (absolute, ``..``, NUL), resolves
   symlinks and checks, component by component, that the real path is inside the real
   workspace (so ``/ws/user-evil`` is not inside ``/ws/user``).
2. ``open_directory`` / ``open_file`` walk that resolved, symlink-free path one component at
   a time from a directory fd with ``O_NOFOLLOW``. A component swapped for a symlink after
   step 1 makes the open fail instead of escaping.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from signalbox.services.tools.registry import ToolError
from signalbox.shared.safe_paths import (
    DIR_FLAGS,
    NotRelative,
    SymlinkInPath,
    open_dir_at,
    relative_path,
)
from signalbox.shared.workspace_paths import PathOutsideWorkspace

# O_NONBLOCK: opening a FIFO someone left in the workspace must not hang the worker.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True)
class Confined:
    """A path inside a workspace: the real workspace and the symlink-free path under it."""

    workspace: Path
    relative: PurePosixPath
    given: str

    @property
    def display(self) -> str:
        """The path as the model should write it next time (relative to the workspace)."""
        return str(self.relative)

    @property
    def absolute(self) -> Path:
        """The real absolute path (for messages and tests; never opened by name)."""
        return self.workspace.joinpath(*self.relative.parts)


def check_relative(path: str) -> PurePosixPath:
    """``path`` as a clean relative path, or ``PathOutsideWorkspace`` naming it."""
    try:
        return relative_path(path)
    except NotRelative as exc:
        raise PathOutsideWorkspace(str(exc)) from None


def confine(workspace: Path, path: str) -> Confined:
    """Resolve ``path`` inside ``workspace`` (which must exist), or ``PathOutsideWorkspace``."""
    pure = check_relative(path)
    base = Path(os.path.realpath(workspace))
    # realpath (not Path.resolve) so a symlink loop resolves to something the walk then refuses.
    real = Path(os.path.realpath(base.joinpath(*pure.parts)))
    try:
        inside = real.relative_to(base)
    except ValueError:
        raise PathOutsideWorkspace(
            f"path leads outside the workspace through a symlink: {path!r}"
        ) from None
    return Confined(workspace=base, relative=PurePosixPath(*inside.parts), given=path)


def _open_error(exc: OSError, where: Confined, dir_fd: int, name: str) -> Exception:
    # A file open meets a symlink as ELOOP; a directory walk (open_dir_at) names it SymlinkInPath.
    if isinstance(exc, SymlinkInPath) or exc.errno == errno.ELOOP:
        return PathOutsideWorkspace(
            f"path is or passes through a symlink that cannot be followed safely: {where.given!r}"
        )
    if exc.errno == errno.ENOENT:
        return ToolError(f"no such file or directory: {where.given!r}")
    if exc.errno == errno.ENOTDIR:
        return ToolError(f"not a directory: {where.given!r}")
    if exc.errno == errno.EACCES:
        return ToolError(f"permission denied: {where.given!r}")
    return ToolError(f"cannot open {where.given!r}: {exc.strerror}")


def _walk(where: Confined, parts: tuple[str, ...]) -> int:
    """A directory fd for ``parts`` under the workspace, never following a symlink."""
    fd = os.open(where.workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    for part in parts:
        try:
            nxt = open_dir_at(fd, part)
        except OSError as exc:
            error = _open_error(exc, where, fd, part)
            os.close(fd)
            raise error from None
        os.close(fd)
        fd = nxt
    return fd


@contextlib.contextmanager
def open_directory(where: Confined) -> Iterator[int]:
    """An fd of the confined directory, closed on exit."""
    fd = _walk(where, where.relative.parts)
    try:
        yield fd
    finally:
        os.close(fd)


def open_subdirectory(parent_fd: int, name: str) -> int | None:
    """An fd of directory ``name`` in ``parent_fd``, or None if it is a symlink or not a dir."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except OSError:
        return None


@contextlib.contextmanager
def open_file(where: Confined) -> Iterator[BinaryIO]:
    """The confined regular file opened for reading; anything else is a ``ToolError``."""
    if not where.relative.parts:
        raise ToolError(f"expected a file, got the workspace directory: {where.given!r}")
    parent = _walk(where, where.relative.parts[:-1])
    try:
        fd = os.open(where.relative.name, _FILE_FLAGS, dir_fd=parent)
    except OSError as exc:
        raise _open_error(exc, where, parent, where.relative.name) from None
    finally:
        os.close(parent)
    with os.fdopen(fd, "rb") as handle:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise ToolError(f"expected a file, got a directory: {where.given!r}")
        if not stat.S_ISREG(mode):
            raise ToolError(f"expected a regular file, got something else: {where.given!r}")
        yield handle


def open_file_at(parent_fd: int, name: str) -> BinaryIO | None:
    """Regular file ``name`` in directory ``parent_fd``, or None (symlink, special, gone)."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=parent_fd)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")


def exists(where: Confined) -> bool:
    """True when the confined path names something (without following a final symlink)."""
    if not where.relative.parts:
        return True
    try:
        parent = _walk(where, where.relative.parts[:-1])
    except ToolError:
        return False
    try:
        os.stat(where.relative.name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return False
    finally:
        os.close(parent)
    return True
