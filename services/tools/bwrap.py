"""The bubblewrap command line of one run: what the program sees, who it is, what it reaches.

bwrap (Debian's ``bubblewrap``) builds the namespaces; this module only says which. It runs
as root without a user namespace ("privileged mode"), so the run's uid is a real host uid
(not root mapped into a namespace), and the program drops to it with ``setpriv`` (util-linux)
after bwrap has set everything up:

- namespaces: mount, pid, network, IPC, UTS, and cgroup where the kernel has one;
- filesystem: an empty tmpfs root, remounted read-only once built, holding only ``/usr``
  (read-only) and the host's ``/bin``, ``/sbin``, ``/lib*`` links or directories; from
  ``/etc`` only ``ld.so.cache``, ``localtime`` and ``alternatives``; the Python install the
  worker runs on (``sys.base_prefix``, read-only) when it is outside ``/usr``; a fresh
  ``/proc`` of the run's pid namespace; a minimal ``/dev``; ``/tmp`` (the scratch directory,
  also ``HOME`` and the working directory) and ``/dev/shm`` as private tmpfs sized to the
  run's memory; the program at ``/sandbox/main.py``, read-only; at ``/workspace`` (the
  working directory) a read-only copy of the conversation's own workspace
  (``workspace_view.py``). No other workspace, no var directory, no virtualenv, no
  repository: nothing else of the deployment;
- identity: a uid/gid of its own, no supplementary groups, no capabilities (bounding set
  emptied), ``no_new_privs``; bwrap's own init (pid 1 of the run) stays root, so the program
  cannot read its ``/proc/1/environ`` (which is empty anyway);
- environment: ``SAFE_ENV`` plus ``HOME``/``TMPDIR``; bwrap itself starts with an empty one;
- lifetime: ``--die-with-parent`` (the run dies with the worker process) and
  ``--new-session`` (no terminal to inject into).
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/etc/alternatives")
SCRATCH = "/tmp"
WORKSPACE = "/workspace"  # the read-only copy of the conversation's workspace, and the cwd
PROGRAM = "/sandbox/main.py"
HOSTNAME = "sandbox"
SAFE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONIOENCODING": "utf-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "HOME": SCRATCH,
    "TMPDIR": SCRATCH,
}


class BwrapUnavailable(RuntimeError):
    """A program the sandbox needs is missing; the message names it."""


@dataclass(frozen=True)
class Interpreter:
    """The Python the sandbox runs, and the install (prefix) it needs to see."""

    executable: Path
    prefix: Path


@functools.cache
def interpreter() -> Interpreter:
    """The worker's own base interpreter: a virtualenv's site-packages stay outside."""
    prefix = Path(sys.base_prefix)
    real = Path(os.path.realpath(sys.executable))
    if real.is_relative_to(prefix):
        return Interpreter(executable=real, prefix=prefix)
    candidate = prefix / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    if candidate.is_file():
        return Interpreter(executable=candidate, prefix=prefix)
    raise BwrapUnavailable(f"no interpreter under sys.base_prefix {str(prefix)!r}")


def find(program: str) -> str:
    """The absolute path of ``program``, or ``BwrapUnavailable`` naming it."""
    found = shutil.which(program)
    if found is None:
        raise BwrapUnavailable(f"{program!r} is not installed (Debian: apt-get install bubblewrap)")
    return found


@functools.cache
def setpriv() -> str:
    """util-linux's setpriv, found where the sandbox can see it (under a system directory)."""
    found = shutil.which("setpriv", path="/usr/bin:/bin:/usr/sbin:/sbin")
    if found is None:
        raise BwrapUnavailable("'setpriv' (util-linux) is not installed")
    return found


def _under_system_dir(path: Path) -> bool:
    return any(path.is_relative_to(d) for d in SYSTEM_DIRS if os.path.isdir(d))


def _system_mounts() -> list[str]:
    args: list[str] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):  # merged /usr: /bin -> usr/bin
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


def _mkdirs(path: Path, made: set[Path]) -> list[str]:
    """``--dir`` for ``path`` and each missing ancestor, 0755 (bwrap's own mode obeys umask)."""
    args: list[str] = []
    for directory in [*reversed(path.parents), path]:
        if directory != Path("/") and directory not in made:
            made.add(directory)
            args += ["--perms", "0755", "--dir", str(directory)]
    return args


def command(
    bwrap: str,
    python: Interpreter,
    program_fd: int,
    uid: int,
    scratch_bytes: int,
    workspace: Path | None = None,
) -> list[str]:
    """The argv that runs the program read from ``program_fd`` confined, as ``uid``, with
    ``workspace`` (a directory) bound read-only at ``WORKSPACE``."""
    made: set[Path] = set()
    args = [
        bwrap,
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        HOSTNAME,
        "--die-with-parent",
        "--new-session",
        *_system_mounts(),
        *_mkdirs(Path("/etc"), made),
    ]
    for path in ETC_FILES:
        args += ["--ro-bind-try", path, path]
    if not _under_system_dir(python.prefix):
        prefix = str(python.prefix)
        args += [*_mkdirs(python.prefix.parent, made), "--ro-bind", prefix, prefix]
    size = str(scratch_bytes)
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += ["--perms", "1777", "--size", size, "--tmpfs", "/dev/shm"]
    args += ["--perms", "1777", "--size", size, "--tmpfs", SCRATCH]
    args += _mkdirs(Path(PROGRAM).parent, made)
    args += ["--perms", "0444", "--ro-bind-data", str(program_fd), PROGRAM]
    if workspace is not None:
        args += ["--ro-bind", str(workspace), WORKSPACE]
    cwd = SCRATCH if workspace is None else WORKSPACE
    args += ["--remount-ro", "/", "--chdir", cwd, "--clearenv"]
    for name, value in SAFE_ENV.items():
        args += ["--setenv", name, value]
    args += [
        setpriv(),
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
        str(python.executable),
        "-I",  # isolated: no PYTHON* variables, no user site, no script directory on sys.path
        "-S",  # the standard library only: the same everywhere, and 90 ms less start-up here
        PROGRAM,
    ]
    return args
