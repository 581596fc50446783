"""run_python: untrusted Python in a bubblewrap sandbox, bounded as a whole by a cgroup of its own.

Where each guarantee comes from (docs/tools.md says the same for operators):

- ``bwrap.py``: what the run sees and who it is. Its own mount namespace holding the system's
  read-only directories, the Python install and a private tmpfs scratch, nothing of the
  deployment (database, logs, other workspaces, repository) but a read-only copy of the
  conversation's own workspace at ``/workspace`` (``workspace_view.py``); its own pid
  namespace with a fresh ``/proc``, so no other process and no other environment is
  visible; no network (an empty network namespace); a random uid/gid per run, no
  capabilities, ``no_new_privs``.
- ``cgroups.py``: memory (no swap) and processes bounded for the run as a whole, and the
  list of every process of the run, which is how the run is killed.
- here: rlimits per process (CPU seconds; address space, so one big allocation is a
  ``MemoryError`` rather than an OOM kill; file size; open files; processes of the run's
  uid), the wall-clock limit, capped output, and on every exit: every process of the run
  SIGKILLed and waited for, its cgroup removed.

The worker refuses to consume ``tools.sandbox`` where this cannot hold (``unavailable``: not
root, no working bwrap or setpriv, no memory cgroup). ``SIGNALBOX_SANDBOX=off`` is the only way
past that, and it removes ``run_python`` from the worker's catalogue: code never runs
unconfined.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import resource
import secrets
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from pydantic import BaseModel, Field

from signalbox.services.tools import bwrap, cgroups
from signalbox.services.tools.registry import Registry, ToolContext, ToolError, ToolTimeout
from signalbox.services.tools.workspace_view import workspace_view
from signalbox.shared.celery_app import SANDBOX_QUEUE
from signalbox.shared.settings import ToolsSettings

log = logging.getLogger(__name__)

registry = Registry()

PR_SET_DUMPABLE = 4
SANDBOX_UID_BASE = 1_500_000_000  # far above any uid a distribution hands out
SANDBOX_UID_SPAN = 1 << 24  # a random uid per run: concurrent runs never share one
BWRAP_PROCESSES = 2  # bwrap's monitor and its pid-1 init count against the run's pids.max
WALL_MARGIN_S = 1.0  # the sandbox stops the code before the task's soft limit, to say why
CODE_MAX_CHARS = 200_000
SIGNAL_EXIT_BASE = 128  # bwrap reports a program killed by signal N as exit status 128 + N
TRIAL_CODE = "import os\nprint(os.getuid() != 0, sorted(os.listdir('/proc'))[:2])\n"
TRIAL_OUTPUT = "True ['1', '2']\n"  # not root; only bwrap's init and itself are visible

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
class Outcome:
    """How one run ended, what it printed (capped), and what the kernel counted."""

    exit_code: int | None  # None when a signal ended it
    signal: int | None
    timed_out: bool
    stdout: str
    stderr: str
    stdout_bytes: int
    stderr_bytes: int
    uid: int  # the run's own uid
    cgroups: tuple[Path, ...]  # the run's cgroup directories (removed on return)
    memory_peak_bytes: int | None  # of every process of the run together
    oom_kills: int  # processes the kernel killed for the run's memory limit
    survivors: tuple[int, ...]  # pids that outlived SIGKILL (always empty, or a bug)
    duration_ms: int


def protect_worker() -> None:
    """Make this process's ``/proc/<pid>/environ`` (its secrets) unreadable to its own uid.

    Sandboxed code cannot see the worker at all (its own pid namespace); this still keeps the
    worker's secrets from anything else that runs as the worker's user, such as an MCP stdio
    server. A non-dumpable process can be inspected only with CAP_SYS_PTRACE. Inherited.
    """
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def _preexec(limits: Limits, group: cgroups.RunCgroup) -> Callable[[], None]:
    """What bwrap's process does before exec: join the run's cgroup, then take the rlimits."""
    procs_files = group.procs_files  # computed before fork: the child only opens and writes
    rlimits = [
        (resource.RLIMIT_CPU, limits.cpu_s, limits.cpu_s + 1),  # SIGXCPU, then SIGKILL
        (resource.RLIMIT_AS, limits.memory_bytes, limits.memory_bytes),
        (resource.RLIMIT_FSIZE, limits.file_bytes, limits.file_bytes),
        (resource.RLIMIT_NOFILE, limits.open_files, limits.open_files),
        # Counts the run's uid only (root, bwrap itself, is exempt): so per run, like pids.max.
        (resource.RLIMIT_NPROC, limits.processes, limits.processes),
        (resource.RLIMIT_CORE, 0, 0),
    ]

    def prepare() -> None:
        # First: every process bwrap creates is then born inside the run's cgroup.
        for path in procs_files:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)
        for which, soft, hard in rlimits:
            resource.setrlimit(which, (soft, hard))

    return prepare


def _read_capped(handle: IO[bytes], limit: int) -> tuple[str, int]:
    size = os.fstat(handle.fileno()).st_size
    handle.seek(0)
    text = handle.read(limit).decode(errors="replace")
    if size > limit:
        text += f"\n[output truncated: {size} bytes, shown the first {limit}]"
    return text, size


@contextlib.contextmanager
def _program(code: str) -> Iterator[int]:
    """An anonymous file holding ``code``, rewound: bwrap copies it into the sandbox."""
    fd = os.memfd_create("signalbox-program", os.MFD_CLOEXEC)
    try:
        os.write(fd, code.encode())
        os.lseek(fd, 0, os.SEEK_SET)
        yield fd
    finally:
        os.close(fd)


def _status(returncode: int) -> tuple[int | None, int | None]:
    """(exit code, signal) from bwrap's status: 128 + N is signal N, as a shell reports it."""
    if returncode < 0:  # bwrap itself was killed: by the time-out or a limit
        return None, -returncode
    if returncode > SIGNAL_EXIT_BASE and returncode - SIGNAL_EXIT_BASE < signal.NSIG:
        return None, returncode - SIGNAL_EXIT_BASE
    return returncode, None


def _exited_within(process: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """Block until ``process`` exits or ``timeout_s`` passes; True if it exited.

    Through a pidfd, woken the moment it exits: ``Popen.wait(timeout)`` polls with sleeps
    of up to 50 ms, which was most of a trivial run's latency.
    """
    pidfd = os.pidfd_open(process.pid)
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        return bool(poller.poll(max(0, int(timeout_s * 1000))))
    finally:
        os.close(pidfd)


def run_sandboxed(
    code: str, limits: Limits, bwrap_program: str = "bwrap", workspace: Path | None = None
) -> Outcome:
    """Run ``code`` confined under ``limits``; every process of it is gone on return.

    ``workspace`` (a directory readable by any uid) is bound read-only at ``/workspace``.
    """
    try:
        argv0 = bwrap.find(bwrap_program)
        python = bwrap.interpreter()
        parents = cgroups.locate()
    except (bwrap.BwrapUnavailable, cgroups.CgroupUnavailable) as exc:
        raise ToolError(f"the sandbox cannot run on this worker: {exc}") from None
    uid = SANDBOX_UID_BASE + secrets.randbelow(SANDBOX_UID_SPAN)
    try:
        group = cgroups.RunCgroup.create(
            parents, limits.memory_bytes, limits.processes + BWRAP_PROCESSES
        )
    except OSError as exc:
        raise ToolError(f"the sandbox could not create the run's cgroup: {exc}") from None
    started = time.monotonic()
    try:
        with (
            _program(code) as program_fd,
            tempfile.TemporaryFile() as out,
            tempfile.TemporaryFile() as err,
        ):
            argv = bwrap.command(argv0, python, program_fd, uid, limits.memory_bytes, workspace)
            try:
                process = subprocess.Popen(
                    argv,
                    env={},  # bwrap's init keeps its environment: give it none
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    pass_fds=(program_fd,),
                    start_new_session=True,
                    preexec_fn=_preexec(limits, group),
                    close_fds=True,
                )
            except (OSError, subprocess.SubprocessError) as exc:
                raise ToolError(f"the sandbox could not start {argv0!r}: {exc}") from None
            try:
                timed_out = not _exited_within(process, limits.wall_s)
            finally:
                # Also on a soft time limit raised while waiting: nothing of the run survives.
                survivors = group.kill()
                process.wait()
            usage = group.usage()
            stdout, stdout_bytes = _read_capped(out, limits.output_bytes)
            stderr, stderr_bytes = _read_capped(err, limits.output_bytes)
    finally:
        # Also when the call is stopped (``termination.CallTerminated``) before the wait.
        group.kill()
        group.remove()
    exit_code, killed_by = _status(process.returncode)
    return Outcome(
        exit_code=exit_code,
        signal=killed_by,
        timed_out=timed_out,
        stdout=stdout,
        stderr=stderr,
        stdout_bytes=stdout_bytes,
        stderr_bytes=stderr_bytes,
        uid=uid,
        cgroups=group.dirs,
        memory_peak_bytes=usage.memory_peak_bytes,
        oom_kills=usage.oom_kills,
        survivors=tuple(survivors),
        duration_ms=int((time.monotonic() - started) * 1000),
    )


def unavailable(bwrap_program: str = "bwrap") -> str | None:
    """Why the sandbox cannot hold on this host, or None once a trial run proved it does."""
    if os.geteuid() != 0:
        return (
            "the tools worker is not root: bubblewrap needs root here to build the namespaces "
            "without a user namespace, to give each run its own uid, and to create its cgroup"
        )
    try:
        bwrap.find(bwrap_program)
        bwrap.setpriv()
        bwrap.interpreter()
        cgroups.locate()
    except (bwrap.BwrapUnavailable, cgroups.CgroupUnavailable) as exc:
        return str(exc)
    trial = Limits(
        cpu_s=5,
        memory_bytes=128 * 1024 * 1024,
        file_bytes=1024 * 1024,
        open_files=32,
        processes=4,
        output_bytes=4096,
        wall_s=10.0,
    )
    try:
        outcome = run_sandboxed(TRIAL_CODE, trial, bwrap_program)
    except (ToolError, OSError) as exc:
        return f"a trial run could not start: {exc}"
    if outcome.exit_code != 0 or outcome.stdout != TRIAL_OUTPUT:
        said = (outcome.stderr or outcome.stdout).strip()[:500]
        return f"a trial run did not confine as required (status {outcome.exit_code}): {said}"
    return None


NO_NETWORK_SIGNS = (
    "Network is unreachable",
    "Connection refused",  # its network namespace has a loopback and nothing listening on it
    "Temporary failure in name resolution",
    "Name or service not known",
)


def _why(outcome: Outcome, limits: Limits) -> str:
    """Why a run failed, in words the model can act on."""
    if outcome.timed_out:
        return (
            f"it ran longer than its wall-clock limit of {limits.wall_s:g} s and was killed "
            "with every process it started"
        )
    if outcome.oom_kills:
        return (
            f"it used more than its memory limit of {limits.memory_bytes // (1024 * 1024)} MB "
            f"(all its processes together); the kernel killed {outcome.oom_kills} of its "
            "processes"
        )
    if outcome.signal in (signal.SIGXCPU, signal.SIGKILL):
        return f"it used more than its CPU time limit of {limits.cpu_s} s and was killed"
    if outcome.signal is not None:
        return f"it was killed by signal {signal.Signals(outcome.signal).name}"
    hints = []
    if "MemoryError" in outcome.stderr:
        hints.append(f"memory is limited to {limits.memory_bytes // (1024 * 1024)} MB")
    if "File too large" in outcome.stderr:
        hints.append(f"each file is limited to {limits.file_bytes // (1024 * 1024)} MB")
    if "No space left on device" in outcome.stderr:
        hints.append("the scratch directory is in memory and shares the memory limit")
    if "Too many open files" in outcome.stderr:
        hints.append(f"open files are limited to {limits.open_files}")
    if "Resource temporarily unavailable" in outcome.stderr or "BlockingIOError" in outcome.stderr:
        hints.append(f"processes are limited to {limits.processes}")
    if "Read-only file system" in outcome.stderr:
        hints.append(
            "/workspace (the working directory) is read-only: write scratch files under /tmp, "
            "and change the workspace with the write tools"
        )
    if any(sign in outcome.stderr for sign in NO_NETWORK_SIGNS):
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
        "Run a Python 3 program (standard library only) in a sandbox. The working directory "
        "/workspace is a read-only copy of the user's workspace (read files there; changes "
        "go through the write tools); /tmp is scratch, deleted afterwards; no network; "
        "limited CPU time, memory, file size and processes. Returns what it prints "
        "(stdout, then stderr)."
    ),
    timeout_s=30,
    queue=SANDBOX_QUEUE,
    mode="confirm",
    side_effect="execute",
)
def run_python(args: RunPythonInput, ctx: ToolContext) -> str:
    """Run ``args.code`` sandboxed; a failed run is a ``ToolError`` saying why."""
    started = time.monotonic()
    ctx.workspace.mkdir(parents=True, exist_ok=True)
    settings = ctx.settings
    budget = settings.sandbox_workspace_mb * 1024 * 1024
    with workspace_view(ctx.workspace, settings.secret_denylist, budget) as view:
        # The copy's time counts against the call's limit: the wall clock is what is left.
        left = ctx.timeout_s - WALL_MARGIN_S - (time.monotonic() - started)
        limits = Limits.from_settings(settings, max(1.0, left))
        outcome = run_sandboxed(args.code, limits, settings.sandbox_bwrap, view.directory)
    note = view.note()
    shown = render(outcome) + (f"\n{note}" if note else "")
    if outcome.exit_code == 0 and not outcome.timed_out and not outcome.oom_kills:
        return shown
    failure = f"run_python failed: {_why(outcome, limits)}\n{shown}"
    raise ToolTimeout(failure) if outcome.timed_out else ToolError(failure)


def main() -> int:
    """``python -m signalbox.services.tools.sandbox``: 0 if the sandbox holds here, else why not."""
    reason = unavailable(os.environ.get("SIGNALBOX_SANDBOX_BWRAP", "bwrap"))
    print(reason or "sandboxed (bubblewrap namespaces, a cgroup per run)")
    return 1 if reason else 0


if __name__ == "__main__":
    sys.exit(main())
