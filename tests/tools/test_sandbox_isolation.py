"""run_python as user A attacks the deployment (issue 12, finding 2): nothing of it is visible.

The targets are laid out as ``signalbox up`` on ``main`` laid them out (finding 7): a var
directory every local user can read, holding the SQLite database and its WAL with user B's
message in clear, the service logs, and user B's workspace. The files are left
world-readable on purpose, so what hides them is the sandbox's own mount namespace, not a
file mode someone may get wrong again. Every attack runs through ``execute``, as a worker
runs the call, and its result is read as the model would read it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from signalbox.admin import migrate
from signalbox.services.tools.cgroups import RUN_PREFIX
from signalbox.services.tools.execution import execute
from signalbox.services.tools.sandbox import SANDBOX_UID_BASE, Limits, run_sandboxed
from signalbox.shared.db import Conversation, Turn, make_engine, make_session_factory
from signalbox.shared.db.users import create_user
from signalbox.shared.ids import new_id
from signalbox.shared.tool_contract import ToolResult
from tests.tools.conftest import ToolEnv

MIB = 1024 * 1024
MEMORY_MB = 512
SAMPLE_EVERY_S = 0.005  # how often the test samples the run's memory from outside
CHILDREN, CHILD_MIB = 6, 400  # 2.4 GiB if each process is bounded on its own
# What reading /proc process by process may over-count: one victim not yet torn down, read
# in the same sweep as the child that took its place (64 MiB was passed by 82 on loaded
# cores, where a sweep is slow). Still far under the 2.4 GiB of an unbounded run, and the
# kernel's own peak is held to the exact limit (test_the_kernel_saw_the_run_stay_under_...).
SAMPLING_SLACK_MB = CHILD_MIB


@dataclass
class Deployment:
    """A deployment's state on disk, readable by every local user, and what it must not leak."""

    var: Path
    database: Path
    logs: Path
    other_workspace: Path
    other_file: Path
    markers: tuple[str, ...]
    engine: Engine


def _world_readable(root: Path) -> None:
    """0755 directories and 0644 files: what ``signalbox up`` on main created."""
    root.chmod(0o755)
    for path in root.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)


@pytest.fixture
def deployment(sandbox_ready: None) -> Iterator[Deployment]:
    # In /tmp (mode 1777), not under pytest's 0700 directory: any uid can reach it.
    var = Path(tempfile.mkdtemp(prefix="signalbox-exposed-"))
    database = var / "signalbox.db"
    url = f"sqlite:///{database}"
    migrate(url)
    engine = make_engine(url)
    db_marker, log_marker, file_marker = (f"{kind}-{new_id('secret')}" for kind in "DLF")
    with make_session_factory(engine)() as session:
        bob, _token = create_user(session, f"bob-{new_id('u')}")
        conversation = Conversation(id=new_id("conv"), user_id=bob.id, workspace="default")
        session.add(conversation)
        session.flush()
        session.add(
            Turn(
                id=new_id("turn"),
                conversation_id=conversation.id,
                user_id=bob.id,
                text=f"bob's private message {db_marker}",
            )
        )
        session.commit()
        bob_id = bob.id
    connection = engine.connect()  # held open: the WAL stays on disk, as in a live deployment
    connection.execute(text("SELECT 1"))
    assert Path(f"{database}-wal").exists()
    logs = var / "logs"
    logs.mkdir()
    (logs / "tools1.log").write_text(f"INFO something about bob {log_marker}\n")
    other_workspace = var / "workspaces" / bob_id / "default"
    other_workspace.mkdir(parents=True)
    other_file = other_workspace / "notes.txt"
    other_file.write_text(f"bob's notes {file_marker}\n")
    _world_readable(var)
    try:
        yield Deployment(
            var=var,
            database=database,
            logs=logs,
            other_workspace=other_workspace,
            other_file=other_file,
            markers=(db_marker, log_marker, file_marker),
            engine=engine,
        )
    finally:
        connection.close()
        engine.dispose()
        shutil.rmtree(var)


def _run(env: ToolEnv, code: str, **settings: object) -> ToolResult:
    request = env.request("run_python", code=code)
    context = env.context(request.call_id, **settings)
    return execute(request, context, env.registry)


PROBE = """
import json, os

def leaks(path):
    data = open(path, 'rb').read()
    return {'bytes': len(data), 'markers': [m for m in MARKERS if m.encode() in data]}

found = {}
for name, path in PATHS.items():
    try:
        if os.path.isdir(path):
            found[name] = {f: leaks(os.path.join(path, f)) for f in os.listdir(path)
                           if os.path.isfile(os.path.join(path, f))}
        else:
            found[name] = leaks(path)
    except OSError as exc:
        found[name] = f'refused: errno {exc.errno}'
print(json.dumps(found))
"""


def _probe(env: ToolEnv, paths: dict[str, str], markers: tuple[str, ...]) -> dict[str, object]:
    code = f"PATHS = {paths!r}\nMARKERS = {list(markers)!r}\n{PROBE}"
    result = _run(env, code)
    assert result.status == "ok", result.error
    found: dict[str, object] = json.loads(result.output)
    return found


def test_user_a_cannot_read_the_database_its_wal_logs_or_user_bs_workspace(
    tool_env: ToolEnv, deployment: Deployment, database_url: str
) -> None:
    targets = {
        "database": deployment.database,
        "database wal": Path(f"{deployment.database}-wal"),
        "log directory": deployment.logs,
        "a log": deployment.logs / "tools1.log",
        "user B's workspace": deployment.other_workspace,
        "user B's file": deployment.other_file,
        "the var directory": deployment.var,
        "the test suite's database": Path(database_url.removeprefix("sqlite:///")),
        "the workspaces root": tool_env.settings.workspaces_root,
        "the code of signalbox": Path(__file__).resolve().parents[2],
    }
    paths = {name: str(path) for name, path in targets.items()}
    found = _probe(tool_env, paths, deployment.markers)
    everything = json.dumps(found)
    for marker in deployment.markers:
        assert marker not in everything, f"{marker} leaked: {everything[:2000]}"
    for name in targets:
        # ENOENT: not refused by a file mode, simply not there for the sandbox.
        assert found[name] == "refused: errno 2", (name, str(found[name])[:300])


def test_user_a_sees_no_process_of_the_deployment_nor_any_environment(
    tool_env: ToolEnv, internal_token: str, sandbox_ready: None
) -> None:
    code = """
import json, os
seen = {}
for pid in sorted(p for p in os.listdir('/proc') if p.isdigit()):
    entry = {}
    for what in ('environ', 'cmdline'):
        try:
            entry[what] = open(f'/proc/{pid}/{what}', 'rb').read().decode('latin-1')
        except OSError as exc:
            entry[what] = f'refused: errno {exc.errno}'
    seen[pid] = entry
try:
    pid1 = open('/proc/1/environ', 'rb').read().decode('latin-1')
except OSError as exc:
    pid1 = f'refused: errno {exc.errno}'
print(json.dumps({'me': os.getpid(), 'seen': seen, 'pid1': pid1}))
"""
    result = _run(tool_env, code)
    assert result.status == "ok", result.error
    found = json.loads(result.output)
    assert internal_token not in result.output and "SIGNALBOX" not in result.output
    assert str(os.getpid()) not in found["seen"], "the worker's process is visible"
    # Its own pid namespace: the run's init and the program itself, nothing of the host.
    assert len(found["seen"]) <= 2, sorted(found["seen"])
    assert found["pid1"] == "refused: errno 13"  # the namespace's init (bwrap), not ours
    own_names = {"PATH", "LANG", "LC_ALL", "PYTHONIOENCODING", "PYTHONDONTWRITEBYTECODE"}
    own_names |= {"HOME", "TMPDIR", "PWD"}  # PWD: bwrap sets it with --chdir
    for pid, entry in found["seen"].items():
        if entry["environ"].startswith("refused"):
            continue
        names = {item.split("=", 1)[0] for item in entry["environ"].split("\0") if item}
        assert names <= own_names, (pid, names)


def _sandbox_pss_bytes() -> int:
    """The memory of its own (anonymous and shmem, proportional) of every process of a
    sandbox run this test process started.

    Read from /proc, independently of the sandbox. File pages (the interpreter, shared
    libraries) are left out: they sit in the page cache, charged to whoever read them first.
    Only runs of this process count (their cgroups are named after it): sandboxes of anything
    else on the machine, another test run included, are not this run's.
    """
    ours = f"/{RUN_PREFIX}{os.getpid()}-"
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            status = Path(f"/proc/{name}/status").read_text()
            uid = int(next(ln for ln in status.splitlines() if ln.startswith("Uid:")).split()[1])
            if uid < SANDBOX_UID_BASE or ours not in Path(f"/proc/{name}/cgroup").read_text():
                continue
            rollup = Path(f"/proc/{name}/smaps_rollup").read_text()
        except (OSError, StopIteration):
            continue
        for line in rollup.splitlines():
            if line.startswith(("Pss_Anon:", "Pss_Shmem:")):
                total += int(line.split()[1]) * 1024
    return total


FORK_AND_ALLOCATE = f"""
import os
ready_r, ready_w = os.pipe()
hold_r, hold_w = os.pipe()
children = []
for _ in range({CHILDREN}):
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        os.close(hold_w)
        block = b'x' * ({CHILD_MIB} << 20)  # written, so every page is really in use
        os.write(ready_w, b'1')
        os.close(ready_w)
        os.read(hold_r, 1)  # hold it until every sibling has allocated or died
        os._exit(0)
    children.append(pid)
os.close(ready_w)
holding = 0
while holding < {CHILDREN} and os.read(ready_r, 1):  # EOF: every child allocated or died
    holding += 1
os.close(hold_w)
statuses = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
print('allocated', holding, 'statuses', statuses)
"""


def test_a_fork_and_allocate_run_is_bounded_as_a_whole(
    tool_env: ToolEnv, sandbox_ready: None
) -> None:
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(SAMPLE_EVERY_S):
            peak = max(peak, _sandbox_pss_bytes())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = _run(tool_env, FORK_AND_ALLOCATE, sandbox_memory_mb=MEMORY_MB, sandbox_cpu_s=10)
    finally:
        done.set()
        sampler.join()
    # Sampled one process at a time, so a victim still being torn down can be counted next to
    # the child that took its place: one child's slack. Unbounded, the run holds 2.4 GiB; the
    # kernel's own peak is held to the exact limit below.
    limit = (MEMORY_MB + SAMPLING_SLACK_MB) * MIB
    assert peak >= CHILD_MIB * MIB // 2, "the sampler saw none of the run's memory"
    assert peak <= limit, f"the run held {peak // MIB} MiB at once, over {MEMORY_MB} MiB"
    assert result.status == "error", result
    assert f"more than its memory limit of {MEMORY_MB} MB" in (result.error or "")
    after = _run(tool_env, "print(6 * 7)")  # the worker (this process) lives on and serves
    assert (after.status, after.output) == ("ok", "42\n"), after.error


def test_the_kernel_saw_the_run_stay_under_its_limit(sandbox_ready: None) -> None:
    limits = Limits(
        cpu_s=10,
        memory_bytes=MEMORY_MB * MIB,
        file_bytes=4 * MIB,
        open_files=32,
        processes=16,
        output_bytes=4096,
        wall_s=20.0,
    )
    outcome = run_sandboxed(FORK_AND_ALLOCATE, limits)
    assert outcome.oom_kills >= CHILDREN - 1, outcome
    assert outcome.memory_peak_bytes is not None
    assert outcome.memory_peak_bytes <= limits.memory_bytes, outcome.memory_peak_bytes
    assert "allocated" in outcome.stdout  # the program itself went on and reported
    assert not any(path.exists() for path in outcome.cgroups), "the run's cgroup was left"
    huge = dataclasses.replace(limits, memory_bytes=CHILDREN * (CHILD_MIB + 64) * MIB)
    outcome = run_sandboxed(FORK_AND_ALLOCATE, huge)
    assert outcome.oom_kills == 0 and f"allocated {CHILDREN}" in outcome.stdout, outcome
