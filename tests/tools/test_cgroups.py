"""Per-run cgroups: found from /proc on v1, v2 and hybrid hosts; a run's processes all killed,
however they forked, and its cgroup removed. The kills run against the real cgroup filesystem."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from signalbox.processes import wait_until
from signalbox.services.tools import cgroups
from signalbox.services.tools.cgroups import RunCgroup, parse_memberships, parse_mounts

HYBRID_MOUNTINFO = """\
25 30 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
33 25 0:28 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
34 33 0:29 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw
38 33 0:33 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec shared:14 - cgroup cgroup rw,memory
39 33 0:34 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec shared:15 - cgroup cgroup rw,pids
40 33 0:35 /docker/abc /sys/fs/cgroup/cpu\\040x rw,relatime - cgroup cgroup rw,cpu,cpuacct
"""
HYBRID_CGROUP = """\
12:pids:/user.slice/user-0.slice
4:memory:/user.slice/user-0.slice/session-1.scope
2:cpu,cpuacct:/docker/abc/inner
0::/user.slice/user-0.slice/session-1.scope
"""
SPAWN_TREE = """
import os, sys, time
if os.fork() == 0:
    os.setsid()  # leaves the session and the process group: the cgroup still holds it
    if os.fork() == 0:
        time.sleep(60)
    time.sleep(60)
print('started', flush=True)
time.sleep(60)
"""


def test_hierarchies_and_memberships_are_read_on_a_hybrid_host() -> None:
    mounts = parse_mounts(HYBRID_MOUNTINFO)
    assert [(m.version, str(m.point)) for m in mounts] == [
        (2, "/sys/fs/cgroup/unified"),
        (1, "/sys/fs/cgroup/memory"),
        (1, "/sys/fs/cgroup/pids"),
        (1, "/sys/fs/cgroup/cpu x"),
    ]
    assert "memory" in mounts[1].controllers and "pids" in mounts[2].controllers
    member = parse_memberships(HYBRID_CGROUP)
    assert member["memory"] == "/user.slice/user-0.slice/session-1.scope"
    assert member["cpuacct"] == "/docker/abc/inner" and member[""] == member["memory"]
    assert mounts[1].directory(member["memory"]) == Path(
        "/sys/fs/cgroup/memory/user.slice/user-0.slice/session-1.scope"
    )
    # A container's hierarchy mounted from /docker/abc: paths outside it are not there.
    assert mounts[3].directory("/docker/abc/inner") == Path("/sys/fs/cgroup/cpu x/inner")
    assert mounts[3].directory("/docker/other") is None
    assert mounts[0].directory("/") == Path("/sys/fs/cgroup/unified")


def _spawn_in(group: RunCgroup) -> subprocess.Popen[str]:
    files = group.procs_files

    def enter() -> None:
        for path in files:
            fd = os.open(path, os.O_WRONLY)
            os.write(fd, b"0")
            os.close(fd)

    process = subprocess.Popen(
        [sys.executable, "-c", SPAWN_TREE], stdout=subprocess.PIPE, text=True, preexec_fn=enter
    )
    assert process.stdout is not None and process.stdout.readline() == "started\n"
    wait_until(lambda: len(group.pids()) == 3, 10.0, "three processes in the run's cgroup")
    return process


def test_a_runs_processes_are_all_killed_however_they_forked(sandbox_ready: None) -> None:
    group = RunCgroup.create(cgroups.locate(), 64 * 1024 * 1024, 8)
    try:
        process = _spawn_in(group)
        pids = group.pids()
        assert group.kill() == []
        assert process.wait() == -9 and group.pids() == set()
        for pid in pids - {process.pid}:  # the grandchildren: not ours to wait for, yet gone
            assert not Path(f"/proc/{pid}").exists() or "Z" in _state(pid)
    finally:
        assert group.remove()
    assert not any(path.exists() for path in group.dirs)


def _state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2 :].split()[0]


def _writable_v2_cgroup() -> Path | None:
    member = parse_memberships(Path("/proc/self/cgroup").read_text())
    for mount in parse_mounts(Path("/proc/self/mountinfo").read_text()):
        own = mount.directory(member[""]) if mount.version == 2 and "" in member else None
        if own is not None and (own / "cgroup.procs").exists() and os.access(own, os.W_OK):
            return own
    return None


def test_on_cgroup_v2_the_run_is_killed_through_cgroup_kill(sandbox_ready: None) -> None:
    own = _writable_v2_cgroup()
    if own is None:
        pytest.skip("no writable cgroup v2 hierarchy with cgroup.kill here")
    path = own / f"{cgroups.RUN_PREFIX}{os.getpid()}-test"
    path.mkdir()
    group = RunCgroup(version=2, dirs=(path,))  # no controllers needed to kill and list
    if not (path / "cgroup.kill").exists():
        group.remove()
        pytest.skip("this kernel's cgroup v2 has no cgroup.kill (before 5.14)")
    try:
        process = _spawn_in(group)
        assert group.kill() == [] and process.wait() == -9
    finally:
        assert group.remove()


def test_a_host_without_a_memory_controller_is_refused_with_the_reason() -> None:
    only_cpu = "40 33 0:35 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    with pytest.raises(cgroups.CgroupUnavailable, match="no memory cgroup controller"):
        cgroups.locate_in(only_cpu, "3:cpu:/\n")


def test_a_process_that_cannot_be_moved_out_of_the_root_cgroup_is_named_not_retried_forever(
    tmp_path: Path,
) -> None:
    # A directory standing for the cgroup: its pid never leaves cgroup.procs, as a process
    # the kernel refuses to move (a kernel thread, another owner's) never does.
    (tmp_path / "cgroup.procs").write_text("4242\n")
    outcome: list[BaseException | None] = []

    def move() -> None:
        try:
            cgroups._move_processes_to_leaf(tmp_path)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=move, daemon=True)
    thread.start()
    thread.join(timeout=10)  # a deadline for a bounded loop, generous on a loaded machine
    assert not thread.is_alive(), "still retrying"
    assert isinstance(outcome[0], cgroups.CgroupUnavailable)
    assert "4242" in str(outcome[0]) and str(tmp_path) in str(outcome[0])
