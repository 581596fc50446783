"""One cgroup per sandbox run: memory and processes bounded for the run as a whole.

rlimits bound each process on its own: a run that forks six children of 400 MiB stays inside
every one of them and still holds 2.4 GiB. A cgroup bounds everything the run starts however
it forks, and lists every process of it, so killing the run misses none.

Each run gets a child of the worker's own cgroup, named ``signalbox-run-<pid>-<random>``:

- cgroup v2 (one hierarchy): ``memory.max``, ``memory.swap.max`` 0 and ``pids.max``; killed
  with ``cgroup.kill``. The parent must hand the memory controller to its children
  (``cgroup.subtree_control``), which a cgroup holding processes cannot do (the "no internal
  processes" rule). So where the worker sits at the root of its own cgroup namespace (a
  container), it first moves that cgroup's processes into a leaf ``signalbox-worker``, as
  Docker's own docker-in-docker entry point does. Anywhere else the operator delegates a
  cgroup (docs/tools.md).
- cgroup v1 (a hierarchy per controller): ``memory.limit_in_bytes`` and, where swap is
  accounted, ``memory.memsw.limit_in_bytes``; ``pids.max`` in the pids hierarchy if mounted.

Where both are mounted (a "hybrid" host), v2 is used only if it has the memory controller.
Creating cgroups needs write access to the cgroup filesystem: in practice, root.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import re
import secrets
import select
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)

RUN_PREFIX = "signalbox-run-"
WORKER_LEAF = "signalbox-worker"  # v2: where a container's processes move to free its root
KILL_DEADLINE_S = 5.0  # the kernel tears a SIGKILLed process down in milliseconds


class CgroupUnavailable(RuntimeError):
    """No per-run memory bound can be made on this host; the message says why."""


@dataclass(frozen=True)
class Mount:
    """One mounted cgroup hierarchy: v2, or a v1 hierarchy with its controllers."""

    version: Literal[1, 2]
    root: str  # the path inside the hierarchy that is mounted at ``point``
    point: Path
    controllers: frozenset[str]  # v1 only (from the super options); v2 reads cgroup.controllers

    def directory(self, path: str) -> Path | None:
        """Where cgroup ``path`` (as /proc/self/cgroup names it) is under this mount, if at all."""
        relative = os.path.relpath(path, self.root)
        if relative == ".." or relative.startswith("../"):
            return None
        return self.point if relative == "." else self.point / relative


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as \040, \011, \012, \134.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mounts(mountinfo: str) -> list[Mount]:
    """The cgroup hierarchies in a ``/proc/<pid>/mountinfo`` text."""
    found = []
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        root, point = _unescape(fields[3]), Path(_unescape(fields[4]))
        if tail[0] == "cgroup2":
            found.append(Mount(version=2, root=root, point=point, controllers=frozenset()))
        elif tail[0] == "cgroup":
            options = frozenset(tail[2].split(","))
            found.append(Mount(version=1, root=root, point=point, controllers=options))
    return found


def parse_memberships(proc_cgroup: str) -> dict[str, str]:
    """Controller -> cgroup path from a ``/proc/<pid>/cgroup`` text; ``""`` is the v2 path."""
    found: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and not controllers:
            found[""] = path
        for controller in filter(None, controllers.split(",")):
            found.setdefault(controller, path)
    return found


@dataclass(frozen=True)
class Parents:
    """Where this worker creates its runs' cgroups."""

    version: Literal[1, 2]
    memory: Path
    pids: Path | None  # None: no pids controller here (RLIMIT_NPROC of the run's uid remains)


def _words(path: Path) -> set[str]:
    try:
        return set(path.read_text().split())
    except OSError:
        return set()


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def _enable(own: Path, controllers: set[str]) -> None:
    _write(own / "cgroup.subtree_control", " ".join(f"+{c}" for c in sorted(controllers)))


MOVE_ROUNDS = 20  # tries to empty a container's root cgroup before giving up with the pids
MOVE_PAUSE_S = 0.01


def _move_processes_to_leaf(own: Path) -> None:
    """Free a container's root cgroup of processes, so it may delegate controllers."""
    leaf = own / WORKER_LEAF
    leaf.mkdir(exist_ok=True)
    failed: dict[str, str] = {}
    # Rounds, because a process may fork while we move; bounded, because one that cannot be
    # moved (another owner's, a kernel thread) would otherwise keep us here for ever.
    for round_ in range(MOVE_ROUNDS + 1):
        pids = _words(own / "cgroup.procs")
        if not pids:
            log.info("moved this container's processes into %s to delegate controllers", leaf)
            return
        if round_ == MOVE_ROUNDS:
            break
        failed = {}
        for pid in sorted(pids):
            try:
                _write(leaf / "cgroup.procs", pid)
            except OSError as exc:  # gone already (fine), or refused
                failed[pid] = exc.strerror or type(exc).__name__
        time.sleep(MOVE_PAUSE_S)
    still = sorted(pids)
    why = "; ".join(f"{pid}: {failed[pid]}" for pid in still if pid in failed)
    raise CgroupUnavailable(
        f"cannot move processes {', '.join(still)} out of {own} into {leaf} after "
        f"{MOVE_ROUNDS} tries ({why or 'they stay'}), so cgroup controllers cannot be "
        "delegated there; delegate a cgroup to the worker (docs/tools.md)"
    )


def _v2_parents(own: Path, path: str) -> Parents:
    if own.name == WORKER_LEAF and "memory" in _words(own.parent / "cgroup.subtree_control"):
        own = own.parent  # a process forked after the move below: runs are the leaf's siblings
    wanted = {"memory", "pids"} & _words(own / "cgroup.controllers")
    if wanted - _words(own / "cgroup.subtree_control"):
        try:
            _enable(own, wanted)
        except OSError as exc:
            if exc.errno != errno.EBUSY or path != "/":
                raise CgroupUnavailable(
                    f"cannot enable {sorted(wanted)} for child cgroups of {own}: {exc.strerror}; "
                    "delegate a cgroup to the worker (docs/tools.md)"
                ) from None
            _move_processes_to_leaf(own)
            _enable(own, wanted)
    return Parents(version=2, memory=own, pids=own if "pids" in wanted else None)


@functools.cache
def locate() -> Parents:
    """Where runs' cgroups go, found once per process (pool children inherit it)."""
    return locate_in(
        Path("/proc/self/mountinfo").read_text(), Path("/proc/self/cgroup").read_text()
    )


def locate_in(mountinfo: str, proc_cgroup: str) -> Parents:
    """Where runs' cgroups go, given this process's mountinfo and cgroup texts."""
    mounts = parse_mounts(mountinfo)
    member = parse_memberships(proc_cgroup)
    for mount in (m for m in mounts if m.version == 2 and "" in member):
        own = mount.directory(member[""])
        if own is not None and "memory" in _words(own / "cgroup.controllers"):
            return _v2_parents(own, member[""])
    v1 = {c: m for m in mounts if m.version == 1 for c in m.controllers}
    if "memory" not in v1 or "memory" not in member:
        raise CgroupUnavailable(
            "no memory cgroup controller is available to the worker (neither a cgroup v2 "
            "hierarchy with 'memory' in cgroup.controllers nor a cgroup v1 memory hierarchy)"
        )
    memory = v1["memory"].directory(member["memory"])
    if memory is None or not os.access(memory, os.W_OK):
        raise CgroupUnavailable(
            f"the worker cannot create cgroups in its memory cgroup {memory or member['memory']}"
        )
    pids = v1["pids"].directory(member["pids"]) if "pids" in v1 and "pids" in member else None
    return Parents(
        version=1, memory=memory, pids=pids if pids and os.access(pids, os.W_OK) else None
    )


@dataclass(frozen=True)
class Usage:
    """What the kernel counted for a run."""

    memory_peak_bytes: int | None  # None where the kernel keeps no peak (v2 before 5.19)
    oom_kills: int  # processes of the run the kernel killed for going over its memory


def _counter(path: Path, name: str) -> int:
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    except OSError:
        pass
    return 0


@dataclass(frozen=True)
class RunCgroup:
    """The cgroup(s) of one run: its memory directory first, then a v1 pids directory."""

    version: Literal[1, 2]
    dirs: tuple[Path, ...]

    @classmethod
    def create(cls, parents: Parents, memory_bytes: int, processes: int) -> RunCgroup:
        """A new, empty cgroup bounding memory (no swap) and processes."""
        _sweep(parents)
        name = f"{RUN_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        extra = (parents.pids / name,) if parents.version == 1 and parents.pids else ()
        group = cls(version=parents.version, dirs=(parents.memory / name, *extra))
        try:
            for path in group.dirs:
                path.mkdir()
            group._limit(memory_bytes, processes, pids=parents.pids is not None)
        except OSError:
            group.remove()
            raise
        return group

    def _limit(self, memory_bytes: int, processes: int, pids: bool) -> None:
        memory = self.dirs[0]
        if self.version == 2:
            _write(memory / "memory.max", str(memory_bytes))
            if (memory / "memory.swap.max").exists():
                _write(memory / "memory.swap.max", "0")
            if pids:
                _write(memory / "pids.max", str(processes))
            return
        _write(memory / "memory.limit_in_bytes", str(memory_bytes))
        if (memory / "memory.memsw.limit_in_bytes").exists():  # memory + swap: no swap at all
            _write(memory / "memory.memsw.limit_in_bytes", str(memory_bytes))
        if len(self.dirs) > 1:
            _write(self.dirs[1] / "pids.max", str(processes))

    @property
    def procs_files(self) -> tuple[bytes, ...]:
        """The ``cgroup.procs`` files a process writes itself into to join the run."""
        return tuple(os.fsencode(path / "cgroup.procs") for path in self.dirs)

    def pids(self) -> set[int]:
        """Every live process of the run (zombies are no longer listed)."""
        return {int(pid) for pid in _words(self.dirs[0] / "cgroup.procs")}

    def kill(self, deadline_s: float = KILL_DEADLINE_S) -> list[int]:
        """SIGKILL every process of the run and wait until each has exited; any survivors."""
        if self.version == 2 and (self.dirs[0] / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                _write(self.dirs[0] / "cgroup.kill", "1")  # atomic: forks cannot outrun it
        deadline = time.monotonic() + deadline_s
        while pids := self.pids():
            with _pidfds(pids) as fds:
                for fd in fds:
                    with contextlib.suppress(ProcessLookupError):
                        signal.pidfd_send_signal(fd, signal.SIGKILL)
                _wait_exited(fds, deadline)
            if time.monotonic() > deadline:
                left = sorted(self.pids())
                if left:
                    log.error("sandbox processes %s survived SIGKILL for %s s", left, deadline_s)
                return left
        return []

    def usage(self) -> Usage:
        """Peak memory and OOM kills of the run (read before ``remove``)."""
        memory, v2 = self.dirs[0], self.version == 2
        try:
            peak_file = memory / ("memory.peak" if v2 else "memory.max_usage_in_bytes")
            peak: int | None = int(peak_file.read_text())
        except (OSError, ValueError):
            peak = None
        events = memory / ("memory.events" if v2 else "memory.oom_control")
        return Usage(memory_peak_bytes=peak, oom_kills=_counter(events, "oom_kill"))

    def remove(self) -> bool:
        """Remove the run's directories (after ``kill``); False if one could not be removed."""
        removed = True
        for path in self.dirs:
            try:
                path.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.error("could not remove the sandbox cgroup %s: %s", path, exc.strerror)
                removed = False
        return removed


@contextlib.contextmanager
def _pidfds(pids: set[int]) -> Iterator[list[int]]:
    """A pidfd for each pid still there: it names that process even if its pid is reused."""
    fds = []
    try:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                fds.append(os.pidfd_open(pid))
        yield fds
    finally:
        for fd in fds:
            os.close(fd)


def _wait_exited(fds: list[int], deadline: float) -> None:
    """Block until every pidfd is readable (its process exited) or the deadline passes."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    waiting = len(fds)
    while waiting:
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0:
            return
        for fd, _event in poller.poll(left_ms):
            poller.unregister(fd)
            waiting -= 1


def _sweep(parents: Parents) -> None:
    """Remove run cgroups left by a process that died mid-run (its run died with it)."""
    for parent in filter(None, (parents.memory, parents.pids)):
        with contextlib.suppress(OSError):
            for entry in os.scandir(parent):
                owner = entry.name.removeprefix(RUN_PREFIX).split("-", 1)[0]
                if not entry.name.startswith(RUN_PREFIX) or not owner.isdigit():
                    continue
                try:
                    os.kill(int(owner), 0)
                except ProcessLookupError:
                    with contextlib.suppress(OSError):  # still busy: left for the next sweep
                        os.rmdir(entry.path)
                except PermissionError:
                    pass
