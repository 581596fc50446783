"""Running untrusted Python in a child that cannot outlive, outgrow or phone out of its call.

What is enforced (docs/tools.md says the same for operators):

- Always: a new session and process group; ``python -I`` (no PYTHON* variables, no user
  site); a scratch working directory, deleted afterwards; an environment of PATH/LANG/HOME
  only, so no secret of the worker is inherited; rlimits on CPU seconds, address space,
  file size and open files; output to anonymous files, of which only the first
  ``sandbox_output_bytes`` are read; on exit or time-out every process of the run is killed.
- Worker running as root: each run gets its own random uid/gid. Then RLIMIT_NPROC counts
  the processes of that run alone, the worker's ``/proc/<pid>/environ`` is unreadable, and
  "every process of the run" is every process of that uid, so ``setsid()`` cannot escape
  the kill. A fresh network namespace (no interface but a down loopback) cuts the network.
- Worker not running as root: the network is cut only where unprivileged user namespaces
  are allowed (probed once; ``isolation().network`` says); RLIMIT_NPROC then counts every
  process of the worker's user, so it is set to what that user runs now plus the limit;
  the child runs as the worker's user, so it can read that user's files and signal its
  processes (the worker's own ``/proc/<pid>/environ`` is protected by making the worker
  non-dumpable, ``protect_worker``); processes that leave the process group survive.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import resource
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from pydantic import BaseModel, Field

from services.tools.registry import Registry, ToolContext, ToolError
from shared.celery_app import SANDBOX_QUEUE
from shared.settings import ToolsSettings

log = logging.getLogger(__name__)

registry = Registry()

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
SANDBOX_UID_BASE = 1_500_000_000  # far above any uid a distribution hands out
SANDBOX_UID_SPAN = 1 << 24  # a random uid per run: concurrent runs never share one
KILL_DEADLINE_S = 5.0  # the kernel tears a SIGKILLed group down in milliseconds
WALL_MARGIN_S = 1.0  # the sandbox stops the code before the task's soft limit, to say why
CODE_MAX_CHARS = 200_000
SAFE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONIOENCODING": "utf-8",
    "PYTHONDONTWRITEBYTECODE": "1",
}
INTERPRETERS = ("/usr/local/bin/python3", "/usr/bin/python3")  # tried after sys.executable

_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class Limits:
    """The resources one run may use."""

    cpu_s: int
    memory_bytes: int
    file_bytes: int
    open_files: int
    processes: int
    output_bytes: int
    wall_s: float

    @classmethod
    def from_settings(cls, settings: ToolsSettings, wall_s: float) -> Limits:
        """The deployment's limits, with the wall-clock limit of this call."""
        return cls(
            cpu_s=settings.sandbox_cpu_s,
            memory_bytes=settings.sandbox_memory_mb * 1024 * 1024,
            file_bytes=settings.sandbox_file_mb * 1024 * 1024,
            open_files=settings.sandbox_open_files,
            processes=settings.sandbox_processes,
            output_bytes=settings.sandbox_output_bytes,
            wall_s=wall_s,
        )


@dataclass(frozen=True)
class Isolation:
    """What this host lets the sandbox enforce beyond rlimits (see the module docstring)."""

    own_uid: bool  # each run as its own uid (the worker is root)
    network: bool  # a fresh network namespace


@dataclass(frozen=True)
class Outcome:
    """How one run ended, and what it printed (capped)."""

    exit_code: int | None  # None when a signal ended it
    signal: int | None
    timed_out: bool
    stdout: str
    stderr: str
    stdout_bytes: int
    stderr_bytes: int
    pgid: int
    uid: int | None  # the run's own uid, when it had one
    duration_ms: int


def _unshare(flags: int) -> None:
    if _libc.unshare(flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare({flags:#x}) failed: {os.strerror(err)}")


def _enter_user_namespace() -> None:
    """Unprivileged: a user namespace mapping us to ourselves, so files stay ours."""
    uid, gid = os.geteuid(), os.getegid()
    _unshare(CLONE_NEWUSER | CLONE_NEWNET)
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
    Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")


def _probe(enter: Callable[[], None]) -> bool:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the probe child
        try:
            enter()
        except BaseException:
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


@functools.cache
def isolation() -> Isolation:
    """Probe once per process what this host enforces."""
    if os.geteuid() == 0:
        found = Isolation(own_uid=True, network=_probe(lambda: _unshare(CLONE_NEWNET)))
    else:
        found = Isolation(own_uid=False, network=_probe(_enter_user_namespace))
    if not found.network:
        log.warning("run_python: no network namespace here; the sandbox's network is NOT blocked")
    if not found.own_uid:
        log.warning("run_python: not root; sandboxed code runs as the worker's user")
    return found


def _others_can_run(path: Path) -> bool:
    """True when a process of an unrelated uid can reach and execute ``path``."""
    real = path.resolve()
    if not real.is_file() or not real.stat().st_mode & stat.S_IXOTH:
        return False
    return all(p.stat().st_mode & stat.S_IXOTH for p in real.parents)


@functools.cache
def interpreter(own_uid: bool) -> str:
    """The Python the sandbox runs; with its own uid it must be reachable by anyone."""
    if not own_uid:
        return sys.executable
    for candidate in (sys.executable, *INTERPRETERS):
        if _others_can_run(Path(candidate)):
            return candidate
    raise ToolError(
        f"no Python interpreter that an unprivileged uid can run: tried {sys.executable!r} "
        f"and {', '.join(INTERPRETERS)}"
    )


def _user_processes(uid: int) -> int:
    return sum(1 for pid in _pids() if _status_uid(pid) == uid)


def _preexec(limits: Limits, iso: Isolation, uid: int | None) -> Callable[[], None]:
    """What the child does between fork and exec (limits first, identity last)."""
    nproc = limits.processes if uid is not None else _user_processes(os.getuid()) + limits.processes
    rlimits = [
        (resource.RLIMIT_CPU, limits.cpu_s, limits.cpu_s + 1),  # SIGXCPU, then SIGKILL
        (resource.RLIMIT_AS, limits.memory_bytes, limits.memory_bytes),
        (resource.RLIMIT_FSIZE, limits.file_bytes, limits.file_bytes),
        (resource.RLIMIT_NOFILE, limits.open_files, limits.open_files),
        (resource.RLIMIT_NPROC, nproc, nproc),
        (resource.RLIMIT_CORE, 0, 0),
    ]

    def prepare() -> None:
        for which, soft, hard in rlimits:
            resource.setrlimit(which, (soft, hard))
        if iso.network and uid is not None:
            _unshare(CLONE_NEWNET)
        elif iso.network:
            # The worker is non-dumpable (protect_worker), which makes /proc/self/uid_map
            # root's; this child holds no secret once it execs, so it may be dumpable again.
            _libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
            _enter_user_namespace()
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        # After setuid, which clears it: if the worker's process is killed at its hard time
        # limit, the run's leader dies with it instead of running on unsupervised.
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    return prepare


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _status_uid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _pgid_and_state(pid: int) -> tuple[int, str] | None:
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            raw = stat_file.read()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()  # the command name may hold spaces and ')'
    return int(fields[2]), fields[0]


def survivors(pgid: int, uid: int | None) -> tuple[list[int], list[int]]:
    """Processes of a run still alive, and its zombies: by process group, and by uid if any."""
    alive: list[int] = []
    zombies: list[int] = []
    for pid in _pids():
        found = _pgid_and_state(pid)
        if found is None:
            continue
        ours = found[0] == pgid or (uid is not None and _status_uid(pid) == uid)
        if ours:
            (zombies if found[1] in "ZX" else alive).append(pid)
    return alive, zombies


def _reap(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def kill_run(pgid: int, uid: int | None) -> list[int]:
    """SIGKILL every process of a run until none is left; the pids that would not die."""
    deadline = time.monotonic() + KILL_DEADLINE_S
    while True:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        alive, zombies = survivors(pgid, uid)
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _reap([z for z in zombies if z != pgid])  # the leader is Popen's to wait for
        if not alive:
            return []
        if time.monotonic() > deadline:
            log.error("sandbox processes %s survived SIGKILL for %s s", alive, KILL_DEADLINE_S)
            return alive
        time.sleep(0.01)  # the kernel is tearing them down; nothing to wait on but /proc


def _read_capped(handle: IO[bytes], limit: int) -> tuple[str, int]:
    size = os.fstat(handle.fileno()).st_size
    handle.seek(0)
    text = handle.read(limit).decode(errors="replace")
    if size > limit:
        text += f"\n[output truncated: {size} bytes, shown the first {limit}]"
    return text, size


def _remove_tree(path: Path) -> None:
    def retry_writable(func: Callable[..., object], target: str, _exc: object) -> None:
        # The code may have chmod-ed its own directories to 000; root ignores that, we do not.
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(target), 0o700)
            os.chmod(target, 0o700)
        with contextlib.suppress(OSError):
            func(target)

    shutil.rmtree(path, onerror=retry_writable)


def protect_worker() -> None:
    """Make this process's ``/proc/<pid>/environ`` (its secrets) unreadable to its own uid.

    A non-dumpable process can be inspected only with CAP_SYS_PTRACE, so sandboxed code that
    runs as the worker's user (a non-root worker) cannot read it. Inherited across fork.
    """
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def _become_subreaper() -> None:
    # Orphans of the run (its own children, once it died) are re-parented here, not to a
    # container's PID 1 that may never reap them; kill_run reaps them.
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def run_sandboxed(code: str, limits: Limits, iso: Isolation | None = None) -> Outcome:
    """Run ``code`` with ``python -I`` under ``limits``; every process of it is gone on return."""
    iso = iso or isolation()
    uid = SANDBOX_UID_BASE + secrets.randbelow(SANDBOX_UID_SPAN) if iso.own_uid else None
    python = interpreter(iso.own_uid)
    scratch = Path(tempfile.mkdtemp(prefix="signalbox-sandbox-"))
    protect_worker()
    _become_subreaper()
    started = time.monotonic()
    pgid = 0
    try:
        (scratch / "main.py").write_text(code)
        if uid is not None:
            for path in (scratch, scratch / "main.py"):
                os.chown(path, uid, uid)
        env = {**SAFE_ENV, "HOME": str(scratch), "TMPDIR": str(scratch)}
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                process = subprocess.Popen(
                    [python, "-I", "main.py"],
                    cwd=scratch,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                    preexec_fn=_preexec(limits, iso, uid),
                    close_fds=True,
                )
            except (OSError, subprocess.SubprocessError) as exc:
                raise ToolError(f"the sandbox could not start {python!r}: {exc}") from None
            pgid = process.pid  # start_new_session: the child leads its own group
            timed_out = False
            try:
                process.wait(timeout=limits.wall_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                # Also on a soft time limit raised inside wait(): nothing of the run survives.
                kill_run(pgid, uid)
                process.wait()
            stdout, stdout_bytes = _read_capped(out, limits.output_bytes)
            stderr, stderr_bytes = _read_capped(err, limits.output_bytes)
        code_or_signal = process.returncode
    finally:
        _remove_tree(scratch)
    return Outcome(
        exit_code=code_or_signal if code_or_signal >= 0 else None,
        signal=-code_or_signal if code_or_signal < 0 else None,
        timed_out=timed_out,
        stdout=stdout,
        stderr=stderr,
        stdout_bytes=stdout_bytes,
        stderr_bytes=stderr_bytes,
        pgid=pgid,
        uid=uid,
        duration_ms=int((time.monotonic() - started) * 1000),
    )


def _why(outcome: Outcome, limits: Limits) -> str:
    """Why a run failed, in words the model can act on."""
    if outcome.timed_out:
        return (
            f"it ran longer than its wall-clock limit of {limits.wall_s:g} s and was killed "
            "with every process it started"
        )
    if outcome.signal == signal.SIGXCPU or (
        outcome.signal == signal.SIGKILL and "MemoryError" not in outcome.stderr
    ):
        return f"it used more than its CPU time limit of {limits.cpu_s} s and was killed"
    if outcome.signal is not None:
        return f"it was killed by signal {signal.Signals(outcome.signal).name}"
    hints = []
    if "MemoryError" in outcome.stderr:
        hints.append(f"memory is limited to {limits.memory_bytes // (1024 * 1024)} MB")
    if "File too large" in outcome.stderr:
        hints.append(f"each file is limited to {limits.file_bytes // (1024 * 1024)} MB")
    if "Too many open files" in outcome.stderr:
        hints.append(f"open files are limited to {limits.open_files}")
    if "Resource temporarily unavailable" in outcome.stderr or "BlockingIOError" in outcome.stderr:
        hints.append(f"processes are limited to {limits.processes}")
    if "Network is unreachable" in outcome.stderr or "Errno 101" in outcome.stderr:
        hints.append("the sandbox has no network")
    return f"it exited with status {outcome.exit_code}" + (
        f" ({'; '.join(hints)})" if hints else ""
    )


def render(outcome: Outcome) -> str:
    """stdout, then stderr if there was any, as the model reads them."""
    parts = [outcome.stdout] if outcome.stdout else []
    if outcome.stderr:
        parts.append(f"[stderr]\n{outcome.stderr}")
    return "\n".join(parts) if parts else "(no output)"


class RunPythonInput(BaseModel):
    """Input of ``run_python``."""

    code: str = Field(
        min_length=1, max_length=CODE_MAX_CHARS, description="a Python 3 program to run"
    )


@registry.tool(
    name="run_python",
    description=(
        "Run a Python 3 program in a sandbox: a scratch directory (deleted afterwards), no "
        "network, limited CPU time, memory, file size and processes. Returns what it prints "
        "(stdout, then stderr). It cannot see the user's workspace; pass data in the code."
    ),
    timeout_s=30,
    queue=SANDBOX_QUEUE,
    mode="confirm",
    side_effect="execute",
)
def run_python(args: RunPythonInput, ctx: ToolContext) -> str:
    """Run ``args.code`` sandboxed; a failed run is a ``ToolError`` saying why."""
    limits = Limits.from_settings(ctx.settings, max(1.0, ctx.timeout_s - WALL_MARGIN_S))
    outcome = run_sandboxed(args.code, limits)
    if outcome.exit_code == 0 and not outcome.timed_out:
        return render(outcome)
    raise ToolError(f"run_python failed: {_why(outcome, limits)}\n{render(outcome)}")
