"""A workspace's files reached through directory fds, never by an absolute path.

The workspace belongs to an agent that can rename anything in it at any moment, for
instance swap a directory on a target's path with a symlink to somewhere else. A path
checked and then opened by name can be redirected in between, so here every file is
reached from the workspace's own fd, one component at a time with ``O_NOFOLLOW``
(``shared/safe_paths.py``), and read, written, renamed and unlinked relative to its
directory's fd. A symlink met on the way is refused (``PathRefused``, a 409), never
followed, so no race can read or write outside the workspace.

A ``Tree`` keeps the directory fds it opened until it is closed: an apply checks, writes
and undoes its files in the very directories it checked, whatever their names are by then.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from signalbox.services.proposals import faults
from signalbox.services.proposals.journal import TEMP_PREFIX
from signalbox.shared.safe_paths import SymlinkInPath, open_dir_at, open_root
from signalbox.shared.workspace_paths import PathOutsideWorkspace, resolve_in_workspace

# Git runs hooks and fsmonitor commands named in .git/config: an agent must never write there.
FORBIDDEN_COMPONENTS = frozenset({".git"})
# O_NONBLOCK: opening a FIFO someone left in the workspace must not hang the service.
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
NEW_FILE_MODE = 0o600  # as tempfile.mkstemp made them; a replaced file keeps its own mode
NEW_DIR_MODE = 0o777  # less the umask, like mkdir(1)


class ApplyError(Exception):
    """A proposal could not be applied; nothing in the workspace was changed."""


class PathRefused(ApplyError):
    """A file's path leaves the workspace (``..``, absolute, or through a symlink)."""


Parts = tuple[str, ...]  # a directory relative to the workspace, symlink-free, by component


@dataclass(frozen=True)
class Target:
    """One file: the fd of its directory (walked with ``O_NOFOLLOW``) and its name there."""

    dir_fd: int
    name: str
    path: str  # as the proposal names it, for messages


def resolve(workspace: Path, relative: str) -> Path:
    """The real target path of ``relative``, refused if it leaves ``workspace``.

    Symlinks that stay inside the workspace are resolved here, as the tools resolve them;
    what the name resolves to is then only ever opened through directory fds.
    """
    try:
        target = resolve_in_workspace(workspace, relative)
    except PathOutsideWorkspace as exc:
        raise PathRefused(str(exc)) from None
    except (OSError, RuntimeError) as exc:  # a symlink loop, or a link swapped mid-resolve
        raise PathRefused(f"cannot resolve {relative!r} in the workspace: {exc}") from None
    base = workspace.resolve()
    if target == base:
        raise PathRefused(f"expected a file path, got the workspace itself: {relative!r}")
    inside = target.relative_to(base)
    if any(part.lower() in FORBIDDEN_COMPONENTS for part in inside.parts):
        raise PathRefused(f"expected a path outside .git, got {relative!r}")
    return target


def locate(workspace: Path, relative: str) -> tuple[Parts, str]:
    """``relative`` as its directory's components under ``workspace`` and its file name."""
    inside = resolve(workspace, relative).relative_to(workspace.resolve())
    return inside.parts[:-1], inside.parts[-1]


class Tree:
    """A workspace opened once (``O_NOFOLLOW``); its directories' fds kept until ``close``."""

    def __init__(self, workspace: Path, root_fd: int) -> None:
        self.workspace = workspace
        self.root_fd = root_fd
        self._dirs: dict[Parts, int] = {}

    @classmethod
    def open(cls, workspace: Path, create: bool = False) -> Tree:
        """Open ``workspace`` (made first if ``create``); ``FileNotFoundError`` if missing."""
        if create:
            workspace.mkdir(parents=True, exist_ok=True)
        try:
            return cls(workspace, open_root(workspace))
        except SymlinkInPath:
            raise PathRefused(f"the workspace {str(workspace)!r} is a symlink") from None

    def close(self) -> None:
        """Close every fd; the tree cannot be used afterwards."""
        for fd in self._dirs.values():
            os.close(fd)
        self._dirs.clear()
        if self.root_fd >= 0:
            os.close(self.root_fd)
            self.root_fd = -1

    def __enter__(self) -> Tree:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _walk(self, parts: Parts, given: str, made: list[Parts] | None) -> tuple[int | None, int]:
        """An fd of ``parts``, making what is missing into ``made``; else ``(None, index)``.

        ``index`` is that of the first missing component. A symlink, or a file where a
        directory belongs, is ``PathRefused`` naming ``given``.
        """
        fd = os.dup(self.root_fd)
        here: Parts = ()
        try:
            for i, part in enumerate(parts):
                here = parts[: i + 1]
                try:
                    nxt = open_dir_at(fd, part)
                except FileNotFoundError:
                    if made is None:
                        return None, i
                    with contextlib.suppress(FileExistsError):  # made meanwhile: checked below
                        os.mkdir(part, NEW_DIR_MODE, dir_fd=fd)
                        made.append(here)
                    nxt = open_dir_at(fd, part)
                os.close(fd)
                fd = nxt
            found, fd = fd, -1
            return found, len(parts)
        except SymlinkInPath:
            raise PathRefused(
                f"{given!r} passes through a symlink ({'/'.join(here)!r}), perhaps swapped in "
                "just now: refused, never followed"
            ) from None
        except NotADirectoryError:
            raise PathRefused(f"a parent of {given!r} is not a directory") from None
        except FileNotFoundError:  # made, then gone again before it could be opened
            raise PathRefused(f"a directory of {given!r} vanished while it was written") from None
        finally:
            if fd >= 0:
                os.close(fd)

    def target(self, relative: str, made: list[Parts] | None = None) -> Target | None:
        """Where ``relative`` lives; None if a directory on its way is missing.

        With ``made``, missing directories are created (and listed there) instead.
        """
        parts, name = locate(self.workspace, relative)
        fd = self._dirs.get(parts)
        if fd is None:
            fd, _ = self._walk(parts, relative, made)
            if fd is None:
                return None
            self._dirs[parts] = fd
        return Target(fd, name, relative)

    def missing_dirs(self, relative: str) -> list[Parts]:
        """The directories writing ``relative`` would have to make, outermost first."""
        parts, _ = locate(self.workspace, relative)
        if parts in self._dirs:
            return []
        fd, first_missing = self._walk(parts, relative, None)
        if fd is not None:
            os.close(fd)
        return [parts[: i + 1] for i in range(first_missing, len(parts))]

    def remove_dir(self, parts: Parts) -> None:
        """Remove the empty directory ``parts`` (a symlink or a full one is left alone)."""
        if not parts:
            return
        with contextlib.suppress(OSError, PathRefused):
            fd, _ = self._walk(parts[:-1], "/".join(parts), None)
            if fd is not None:
                try:
                    os.rmdir(parts[-1], dir_fd=fd)
                finally:
                    os.close(fd)

    def remove_temps(self, relative: str, prefix: str) -> None:
        """Delete the files named ``prefix*`` beside ``relative`` (never a tree walk)."""
        with contextlib.suppress(PathRefused):
            target = self.target(relative)
            if target is None:
                return
            for name in os.listdir(target.dir_fd):
                if name.startswith(prefix):
                    with contextlib.suppress(OSError):  # gone already, or not a file
                        os.unlink(name, dir_fd=target.dir_fd)


def read(target: Target) -> bytes | None:
    """The file's bytes, or None if it does not exist; anything but a regular file is refused."""
    try:
        fd = os.open(target.name, READ_FLAGS, dir_fd=target.dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PathRefused(f"{target.path!r} is a symlink: refused, never followed") from None
        raise
    with os.fdopen(fd, "rb") as handle:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise PathRefused(f"expected a file, got a directory: {target.path!r}")
        if not stat.S_ISREG(mode):
            raise PathRefused(f"expected a regular file, got something else: {target.path!r}")
        return handle.read()


def read_current(workspace: Path, relative: str) -> bytes | None:
    """The bytes of ``relative`` in ``workspace`` now (None: absent); ``PathRefused``."""
    try:
        tree = Tree.open(workspace)
    except FileNotFoundError:
        return None
    with tree:
        target = tree.target(relative)
        return None if target is None else read(target)


def _mode_to_keep(target: Target) -> int | None:
    """The mode of the file being replaced (None: new); a directory or symlink is refused."""
    try:
        st = os.stat(target.name, dir_fd=target.dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        raise PathRefused(f"{target.path!r} became a symlink: refused, never replaced")
    if stat.S_ISDIR(st.st_mode):
        raise PathRefused(f"expected a file, got a directory: {target.path!r}")
    return st.st_mode & 0o7777


def write_atomic(target: Target, data: bytes, prefix: str = TEMP_PREFIX) -> None:
    """Replace ``target`` with ``data``: temp file, fsync, rename, fsync the directory.

    The temp file is made, renamed and (on any failure) removed in the target's directory
    fd, so neither it nor the file can end up anywhere else, and none is left behind.
    """
    mode = _mode_to_keep(target)
    tmp = f"{prefix}{secrets.token_hex(8)}"
    fd = os.open(tmp, TEMP_FLAGS, NEW_FILE_MODE, dir_fd=target.dir_fd)
    renamed = False
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if mode is not None:
                os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        faults.crash_point(faults.CRASH_BEFORE_RENAME)
        try:
            os.rename(tmp, target.name, src_dir_fd=target.dir_fd, dst_dir_fd=target.dir_fd)
        except IsADirectoryError:  # a directory appeared under the file's name meanwhile
            raise PathRefused(f"expected a file, got a directory: {target.path!r}") from None
        renamed = True
    finally:
        if not renamed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=target.dir_fd)
    os.fsync(target.dir_fd)


def delete_file(target: Target) -> None:
    """Remove ``target`` durably (a symlink put there is removed itself, never followed)."""
    try:
        os.unlink(target.name, dir_fd=target.dir_fd)
    except IsADirectoryError:
        raise PathRefused(f"expected a file, got a directory: {target.path!r}") from None
    os.fsync(target.dir_fd)
