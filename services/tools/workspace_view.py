"""run_python's view of the workspace: a read-only copy of what the model may see, per run.

Why a copy and not a bind mount of the workspace itself: workspace files are private to the
service user (0600, ``shared/file_modes.py``) and the program runs as a random uid of its
own, which must not be able to read anything the service user owns. bubblewrap cannot
remap owners (no idmapped mounts), so the worker copies the workspace, through directory
fds and never following a symlink, into a directory readable by that uid, and bwrap binds
the copy read-only at ``/workspace``. What the copy leaves out (the denylist, ``.git/``, files
past the size budget, entries past ``MAX_ENTRIES`` or ``MAX_DEPTH``, an entry the copy fails
on such as a path too long for the kernel) is not there to be found, whatever the program
does; the program's output names what is missing. The walk keeps its own stack: a workspace
1,000 directories deep is a workspace like another, not a crash of the tool.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from signalbox.services.tools.denylist import denied
from signalbox.shared.safe_paths import open_dir_at, open_root

STAGE_PREFIX = "signalbox-ws-"
# Entries (files, directories and symlinks alike) in one copy: a copy this large is not what
# a program analysing files needs, and each entry costs the call's time.
MAX_ENTRIES = 100_000
# Directory levels copied; deeper ones are left out and named. The walk is iterative, so
# this is not about Python's stack: it bounds the open fds (one per level) and the paths.
MAX_DEPTH = 64
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_COPY_CHUNK = 1024 * 1024
_NAMED = 10  # entries a note names before "and N more"


@dataclass
class View:
    """The copy: its directory, what it holds, and what was left out (for the model)."""

    directory: Path
    files: int = 0
    entries: int = 0
    bytes: int = 0
    over_budget: list[str] = field(default_factory=list)
    too_many: bool = False
    too_deep: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def note(self) -> str:
        """Lines telling the program's reader what /workspace lacks, or ''."""
        lines = []
        for names, why in (
            (self.over_budget, "over the size limit of the copy"),
            (self.too_deep, f"more than {MAX_DEPTH} directories deep"),
            (self.failed, "could not be copied"),
        ):
            if names:
                shown = ", ".join(names[:_NAMED])
                more = f" and {len(names) - _NAMED} more" if len(names) > _NAMED else ""
                lines.append(f"[/workspace holds no copy of {shown}{more}: {why}]")
        if self.too_many:
            lines.append(f"[/workspace holds only the first {MAX_ENTRIES} entries]")
        return "\n".join(lines)


def _sweep(root: Path) -> None:
    """Remove copies left by worker processes that were killed mid-run."""
    with contextlib.suppress(OSError), os.scandir(root) as entries:
        for entry in entries:
            owner = entry.name.removeprefix(STAGE_PREFIX).split("-", 1)[0]
            if not entry.name.startswith(STAGE_PREFIX) or not owner.isdigit():
                continue
            if int(owner) == os.getpid() or Path(f"/proc/{owner}").exists():
                continue
            shutil.rmtree(entry.path, ignore_errors=True)


def _copy_file(src_fd: int, dest: Path, size: int) -> int:
    """Copy at most ``size`` bytes (what the budget counted: the file may grow meanwhile)."""
    out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    copied = 0
    try:
        os.fchmod(out, 0o644)  # the worker's umask (077) must not narrow it
        while copied < size and (chunk := os.read(src_fd, min(_COPY_CHUNK, size - copied))):
            os.write(out, chunk)
            copied += len(chunk)
    finally:
        os.close(out)
    return copied


def _listing(fd: int) -> Iterator[os.DirEntry[str]]:
    with os.scandir(fd) as it:
        return iter(sorted(it, key=lambda e: e.name))


def _copy_entry(
    fd: int, entry: os.DirEntry[str], rel: PurePosixPath, target: Path, view: View, budget: int
) -> None:
    """Copy one symlink or regular file (anything else is left out); ``OSError`` if it fails."""
    if entry.is_symlink():
        # Resolved inside the sandbox, where nothing but this copy is: harmless.
        os.symlink(os.readlink(entry.name, dir_fd=fd), target)
        view.entries += 1
        return
    if not entry.is_file(follow_symlinks=False):
        return
    src = os.open(entry.name, _FILE_FLAGS, dir_fd=fd)
    try:
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode):
            return
        if view.bytes + st.st_size > budget:
            view.over_budget.append(str(rel))
            return
        view.bytes += _copy_file(src, target, st.st_size)
        view.files += 1
        view.entries += 1
    finally:
        os.close(src)


def _copy_tree(root_fd: int, dest: Path, view: View, patterns: Sequence[str], budget: int) -> None:
    """Copy what ``root_fd`` holds into ``dest``, depth first, with an explicit stack."""
    stack = [(_listing(root_fd), root_fd, PurePosixPath(), dest)]
    try:
        while stack:
            entries, fd, base, dest_dir = stack[-1]
            entry = next(entries, None)
            if entry is None:
                stack.pop()
                if fd != root_fd:
                    os.close(fd)
                continue
            if view.entries >= MAX_ENTRIES:
                view.too_many = True
                return
            rel, target = base / entry.name, dest_dir / entry.name
            is_dir = entry.is_dir(follow_symlinks=False)
            if denied(rel, is_dir, patterns) is not None:
                continue
            if is_dir and len(stack) > MAX_DEPTH:
                view.too_deep.append(f"{rel}/")
                continue
            try:
                if not is_dir:
                    _copy_entry(fd, entry, rel, target, view, budget)
                    continue
                sub = open_dir_at(fd, entry.name)
            except OSError as exc:
                view.failed.append(f"{rel} ({exc.strerror or type(exc).__name__})")
                continue
            try:
                target.mkdir()
                target.chmod(0o755)
                stack.append((_listing(sub), sub, rel, target))
                view.entries += 1
            except OSError as exc:
                os.close(sub)
                view.failed.append(f"{rel}/ ({exc.strerror or type(exc).__name__})")
    finally:
        for _entries, fd, _base, _dest in stack:
            if fd != root_fd:
                os.close(fd)


@contextlib.contextmanager
def workspace_view(workspace: Path, patterns: Sequence[str], budget_bytes: int) -> Iterator[View]:
    """A copy of ``workspace`` (0755/0644, secrets left out), removed on exit."""
    root = Path(tempfile.gettempdir())
    _sweep(root)
    stage = Path(tempfile.mkdtemp(prefix=f"{STAGE_PREFIX}{os.getpid()}-", dir=root))  # 0700
    try:
        directory = stage / "workspace"
        directory.mkdir()
        directory.chmod(0o755)
        view = View(directory)
        try:
            fd = open_root(workspace)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise
        else:
            try:
                _copy_tree(fd, directory, view, patterns, budget_bytes)
            finally:
                os.close(fd)
        yield view
    finally:
        shutil.rmtree(stage, ignore_errors=True)
