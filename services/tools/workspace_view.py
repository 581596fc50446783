"""run_python's view of the workspace: a read-only copy of what the model may see, per run.

Why a copy and not a bind mount of the workspace itself: workspace files are private to the
service user (0600, ``shared/file_modes.py``) and the program runs as a random uid of its
own, which must not be able to read anything the service user owns. bubblewrap cannot
remap owners (no idmapped mounts), so the worker copies the workspace, through directory
fds and never following a symlink, into a directory readable by that uid, and bwrap binds
the copy read-only at ``/workspace``. What the copy leaves out (the denylist, ``.git/``, and
files past the size budget) is not there to be found, whatever the program does.
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

from services.tools.denylist import denied
from shared.safe_paths import open_dir_at, open_root

STAGE_PREFIX = "signalbox-ws-"
MAX_ENTRIES = 100_000  # a copy this large is not what a program analysing files needs
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_COPY_CHUNK = 1024 * 1024


@dataclass
class View:
    """The copy: its directory, and what was left out for the budget (for the model)."""

    directory: Path
    files: int = 0
    bytes: int = 0
    over_budget: list[str] = field(default_factory=list)

    def note(self) -> str:
        """A line telling the program's reader what /workspace lacks, or ''."""
        if not self.over_budget:
            return ""
        shown = ", ".join(self.over_budget[:10])
        more = f" and {len(self.over_budget) - 10} more" if len(self.over_budget) > 10 else ""
        return f"[/workspace holds no copy of {shown}{more}: over the size limit of the copy]"


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


def _copy_file(src_fd: int, dest: Path) -> None:
    out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        os.fchmod(out, 0o644)  # the worker's umask (077) must not narrow it
        while chunk := os.read(src_fd, _COPY_CHUNK):
            os.write(out, chunk)
    finally:
        os.close(out)


def _copy_tree(
    fd: int, base: PurePosixPath, dest: Path, view: View, patterns: Sequence[str], budget: int
) -> None:
    with os.scandir(fd) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        if view.files >= MAX_ENTRIES:
            view.over_budget.append(str(base / entry.name))
            return
        rel = base / entry.name
        target = dest / entry.name
        is_dir = entry.is_dir(follow_symlinks=False)
        if denied(rel, is_dir, patterns) is not None:
            continue
        if entry.is_symlink():
            # Resolved inside the sandbox, where nothing but this copy is: harmless.
            with contextlib.suppress(OSError):
                os.symlink(os.readlink(entry.name, dir_fd=fd), target)
            continue
        if is_dir:
            try:
                sub = open_dir_at(fd, entry.name)
            except OSError:
                continue
            try:
                target.mkdir()
                target.chmod(0o755)
                _copy_tree(sub, rel, target, view, patterns, budget)
            finally:
                os.close(sub)
        elif entry.is_file(follow_symlinks=False):
            try:
                src = os.open(entry.name, _FILE_FLAGS, dir_fd=fd)
            except OSError:
                continue
            try:
                st = os.fstat(src)
                if not stat.S_ISREG(st.st_mode):
                    continue
                if view.bytes + st.st_size > budget:
                    view.over_budget.append(str(rel))
                    continue
                _copy_file(src, target)
                view.files += 1
                view.bytes += st.st_size
            finally:
                os.close(src)


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
                _copy_tree(fd, PurePosixPath(), directory, view, patterns, budget_bytes)
            finally:
                os.close(fd)
        yield view
    finally:
        shutil.rmtree(stage, ignore_errors=True)
