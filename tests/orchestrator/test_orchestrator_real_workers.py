"""Tools that tell the truth and stop when told, with real processes: the orchestrator (real
``anthropic`` SDK against the fake Messages API), a prefork tools worker serving the sandbox,
and the proposals service.

A hostile model goes after ``.git/config`` holding a credential in its remote URL with every
tool it has (read, list, search, run_python): the credential never reaches the model.

A user cancels; afterwards nothing of the turn runs or lands:

- a ``run_python`` sleeping in the sandbox is stopped: its call ends ``cancelled``, and no
  process of the run (its uid) and no run cgroup remains moments after the cancel;
- a write still in flight at the cancel (deaf to SIGTERM, it proposes after) leaves no
  pending proposal: the proposals service refuses it for the cancelled turn;
- (a proposal made before the cancel is withdrawn: ``test_orchestrator_cancel_withdraws``).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from signalbox.processes import (
    Child,
    ServiceCommands,
    child_env,
    http_ok,
    log_contains,
    stop_together,
    wait_until,
)
from signalbox.redis_server import free_port
from signalbox.services.tools.cgroups import RUN_PREFIX
from signalbox.services.tools.sandbox import SANDBOX_UID_BASE, SANDBOX_UID_SPAN, unavailable
from signalbox.services.tools.test_tools import counter_key
from signalbox.shared.celery_app import RUN_TURN_TASK, make_celery
from signalbox.shared.db.models import Proposal, ToolCall, Turn
from signalbox.shared.event_stream import EventStream
from signalbox.shared.events import Event
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.settings import CommonSettings
from signalbox.shared.tool_contract import read_catalogue
from tests.fake_anthropic import FakeAnthropic, Scripted, text, tool_use

from .support import make_conversation, make_turn

REPO = Path(__file__).resolve().parents[2]
TURN_S = 30.0
# From the cancel to the last process of the sandbox run gone: a deadline to wait for on a
# loaded machine, not a performance assertion (measured 0.23-0.30 s, docs/tools.md).
GONE_WITHIN_S = 15.0
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass
class Deployment:
    keys: RedisKeys
    client: Celery
    redis: redis.Redis
    fake: FakeAnthropic
    workspaces: Path
    children: list[Child] = field(default_factory=list)

    def events(self, conversation_id: str) -> list[Event]:
        return EventStream(self.redis, self.keys).read_after(conversation_id, None)


@pytest.fixture(scope="module")
def deployment(
    tmp_path_factory: pytest.TempPathFactory,
    redis_url: str,
    redis_prefix: str,
    database_url: str,
    internal_token: str,
) -> Iterator[Deployment]:
    reason = unavailable()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the sandbox tests, but the sandbox cannot hold: {reason}")
        pytest.skip(f"the sandbox cannot hold here: {reason}")
    prefix = f"{redis_prefix}cancel-{uuid.uuid4().hex[:6]}:"
    logs = tmp_path_factory.mktemp("cancel-tools")
    workspaces = tmp_path_factory.mktemp("cancel-workspaces")
    port = free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    common = {
        "SIGNALBOX_REDIS_URL": redis_url,
        "SIGNALBOX_REDIS_PREFIX": prefix,
        "SIGNALBOX_DATABASE_URL": database_url,
        "SIGNALBOX_INTERNAL_TOKEN": internal_token,
        "SIGNALBOX_WORKSPACES_ROOT": str(workspaces),
        "SIGNALBOX_PROPOSALS_URL": f"http://127.0.0.1:{port}",
        "PYTHONPATH": str(REPO),
    }
    policy = {"tools": {"run_python": {"mode": "auto"}}}
    commands = ServiceCommands(tools_concurrency=2, orchestrator_concurrency=2)
    with FakeAnthropic() as fake:
        children = [
            Child(
                "proposals",
                commands.proposals(port),
                logs / "proposals.log",
                child_env(base, common),
            ),
            Child(
                "orchestrator",
                commands.orchestrator("orch-cancel@%h"),
                logs / "orchestrator.log",
                child_env(
                    base,
                    {
                        **common,
                        "ANTHROPIC_API_KEY": "sk-test",
                        "ANTHROPIC_BASE_URL": fake.url,
                        "SIGNALBOX_TOOL_POLICY": json.dumps(policy),
                        "SIGNALBOX_TOOL_GRACE_S": "1",
                    },
                ),
            ),
            Child(
                "tools",
                commands.tools("tools-cancel@%h"),
                logs / "tools.log",
                child_env(base, {**common, "SIGNALBOX_TEST_TOOLS": "1"}),
            ),
        ]
        keys = RedisKeys(prefix)
        client = redis.Redis.from_url(redis_url)
        app = make_celery(
            "cancel-test-client",
            CommonSettings(redis_url=redis_url, redis_prefix=prefix, database_url=database_url),
        )
        try:
            for child in children:
                child.start()
            children[0].wait_ready(http_ok(f"http://127.0.0.1:{port}/healthz"))
            for child in children[1:]:
                child.wait_ready(log_contains(child, " ready."))
            wait_until(
                lambda: {"run_python", "propose_later"} <= set(read_catalogue(client, keys)),
                timeout_s=30,
                what="the tool catalogue",
            )
            yield Deployment(keys, app, client, fake, workspaces, children)
        finally:
            stop_together(children)
            client.close()
            app.close()


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rfind(")") + 2 :].split()[1])


def _descends_from(pid: int, root: int) -> bool:
    for _ in range(64):
        parent = _parent(pid)
        if parent is None or parent <= 1:
            return False
        if parent == root:
            return True
        pid = parent
    return False


def _run_processes(root: int) -> list[int]:
    """Live processes of sandbox runs started under ``root`` (the tools worker): the program
    and what it started (a sandbox uid), and bwrap itself."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            status = Path(f"/proc/{name}/status").read_text()
            argv0 = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0", 1)[0]
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        uid = int(fields["Uid"].split()[0])
        zombie = fields.get("State", "").strip().startswith(("Z", "X"))
        ours = SANDBOX_UID_BASE <= uid < SANDBOX_UID_BASE + SANDBOX_UID_SPAN
        if (ours or argv0.endswith(b"bwrap")) and not zombie and _descends_from(int(name), root):
            found.append(int(name))
    return found


def _run_cgroups(root: int) -> list[Path]:
    """Run cgroup directories of pool processes of ``root`` (named after their pid)."""
    found = []
    for top, dirs, _files in os.walk(CGROUP_ROOT):
        for d in dirs:
            owner = d.removeprefix(RUN_PREFIX).split("-", 1)[0]
            if d.startswith(RUN_PREFIX) and owner.isdigit() and _parent(int(owner)) == root:
                found.append(Path(top) / d)
        dirs[:] = [d for d in dirs if not d.startswith(RUN_PREFIX)]
    return found


def _cancel(d: Deployment, db: sessionmaker[Session], turn_id: str) -> None:
    """What the gateway's cancel does: the committed flag, then the control message."""
    with db() as s, s.begin():
        s.execute(update(Turn).where(Turn.id == turn_id).values(cancel_requested=True))
    d.redis.publish(d.keys.control_channel, json.dumps({"type": "cancel", "turn_id": turn_id}))


def _call(db: sessionmaker[Session], turn_id: str, tool: str) -> ToolCall | None:
    with db() as s:
        return s.scalars(
            select(ToolCall).where(ToolCall.turn_id == turn_id, ToolCall.tool == tool)
        ).first()


def _start(
    d: Deployment,
    db: sessionmaker[Session],
    make_user: Callable[[], tuple[str, str]],
    steps: Sequence[Scripted],
) -> tuple[str, str, str]:
    d.fake.script(steps)
    user_id, _ = make_user()
    conversation_id = make_conversation(db, user_id)
    turn_id = make_turn(db, conversation_id, user_id, "go", seq=1)
    d.client.send_task(RUN_TURN_TASK, args=[turn_id])
    return user_id, conversation_id, turn_id


def _finished_kind(d: Deployment, conversation_id: str) -> dict[str, Any]:
    """The data of the conversation's ``turn_finished``, or {} while there is none."""
    for e in d.events(conversation_id):
        if e.kind == "turn_finished":
            return e.data
    return {}


def test_a_cancel_stops_a_running_sandbox_and_leaves_no_process_of_it(
    deployment: Deployment,
    db_sessions: sessionmaker[Session],
    make_user: Callable[[], tuple[str, str]],
) -> None:
    d = deployment
    tools = d.children[2].pid
    assert _run_processes(tools) == [], "a sandbox run of this worker is alive already"
    code = "import time\ntime.sleep(20)\nprint('still', 'here')\n"
    _user, conversation_id, turn_id = _start(
        d,
        db_sessions,
        make_user,
        [[text("Running it."), tool_use("run_python", {"code": code})]],
    )
    running = wait_until(
        lambda: _run_processes(tools), timeout_s=TURN_S, what="the sandboxed program"
    )
    assert running and _run_cgroups(tools)

    cancelled_at = time.monotonic()
    _cancel(d, db_sessions, turn_id)
    wait_until(lambda: not _run_processes(tools), timeout_s=GONE_WITHIN_S, what="the run's end")
    gone_ms = (time.monotonic() - cancelled_at) * 1000
    wait_until(lambda: not _run_cgroups(tools), timeout_s=GONE_WITHIN_S, what="its cgroup")
    cgroup_ms = (time.monotonic() - cancelled_at) * 1000
    print(f"cancel -> sandbox processes gone {gone_ms:.0f} ms, cgroup gone {cgroup_ms:.0f} ms")

    finished = wait_until(
        lambda: _finished_kind(d, conversation_id), timeout_s=TURN_S, what="turn_finished"
    )
    assert finished["status"] == "cancelled"
    call = _call(db_sessions, turn_id, "run_python")
    assert call is not None and call.status == "cancelled"
    ended = [e.data for e in d.events(conversation_id) if e.kind == "tool_call_finished"]
    assert [(e["tool"], e["status"]) for e in ended] == [("run_python", "cancelled")]
    assert "still here" not in json.dumps([e.data for e in d.events(conversation_id)])
    # The pool process that was running it lives on and serves the next run.
    assert d.children[2].alive()


def test_a_write_in_flight_at_the_cancel_leaves_no_pending_proposal(
    deployment: Deployment,
    db_sessions: sessionmaker[Session],
    make_user: Callable[[], tuple[str, str]],
) -> None:
    d = deployment
    started = uuid.uuid4().hex
    user_id, conversation_id, turn_id = _start(
        d,
        db_sessions,
        make_user,
        [
            [
                text("Writing it."),
                tool_use(
                    "propose_later",
                    {"path": "late.txt", "content": "x", "seconds": 1.0, "started_key": started},
                ),
            ],
        ],
    )
    wait_until(
        lambda: d.redis.get(counter_key(d.keys, started)),
        timeout_s=TURN_S,
        what="the write call to be in flight",
    )
    _cancel(d, db_sessions, turn_id)
    finished = wait_until(
        lambda: _finished_kind(d, conversation_id), timeout_s=TURN_S, what="turn_finished"
    )
    assert finished["status"] == "cancelled"
    call = _call(db_sessions, turn_id, "propose_later")
    assert call is not None
    assert call.status == "cancelled"
    # The call outlives the cancel (its signal is blocked in it) and then tries to propose.
    wait_until(
        lambda: d.redis.get(counter_key(d.keys, started)) == b"2",
        timeout_s=TURN_S,
        what="the late write to try to propose",
    )
    with db_sessions() as s:
        made = list(s.scalars(select(Proposal).where(Proposal.user_id == user_id)))
    assert [p.status for p in made] == []
    assert not (d.workspaces / user_id / "default" / "late.txt").exists()
    assert "proposal_created" not in [e.kind for e in d.events(conversation_id)]


CREDENTIAL = "ghp_s3cr3tT0ken4f2a"


def test_a_credential_in_git_config_never_reaches_the_model(
    deployment: Deployment,
    db_sessions: sessionmaker[Session],
    make_user: Callable[[], tuple[str, str]],
) -> None:
    d = deployment
    user_id, _ = make_user()
    workspace = d.workspaces / user_id / "default"
    (workspace / ".git").mkdir(parents=True)
    (workspace / ".git" / "config").write_text(
        f'[remote "origin"]\n\turl = https://bot:{CREDENTIAL}@github.com/acme/app.git\n'
    )
    (workspace / "notes.md").write_text("remote is on github\n")
    os.symlink(".git/config", workspace / "config-link")
    code = (
        "import os\n"
        "for top, dirs, files in os.walk('.'):\n"
        "    for f in files:\n"
        "        print(os.path.join(top, f), open(os.path.join(top, f), errors='replace').read())\n"
        "print(open('.git/config').read())\n"
    )
    d.fake.script(
        [
            [
                text("Looking for credentials."),
                tool_use("read_file", {"path": ".git/config"}),
                tool_use("read_file", {"path": "config-link"}),
                tool_use("list_dir", {"path": ".", "depth": 5}),
                tool_use("search_files", {"pattern": "url|ghp_|bot:"}),
                tool_use("run_python", {"code": code}),
            ],
            [text("Found nothing.")],
        ]
    )
    conversation_id = make_conversation(db_sessions, user_id)
    turn_id = make_turn(db_sessions, conversation_id, user_id, "find the token", seq=1)
    assert d.client.send_task(RUN_TURN_TASK, args=[turn_id]).get(timeout=TURN_S) == "completed"

    requests = [r.body for r in d.fake.requests]
    results = [
        b
        for m in requests[-1]["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result"
    ]
    assert len(results) == 5
    assert CREDENTIAL not in json.dumps(requests)
    assert CREDENTIAL not in json.dumps([e.data for e in d.events(conversation_id)])
    by_tool = {
        e.data["tool"]: e.data for e in d.events(conversation_id) if e.kind == "tool_call_finished"
    }
    assert by_tool["run_python"]["status"] == "error"  # .git/config is not in its copy
    assert "FileNotFoundError" in by_tool["run_python"]["error"]
    assert "notes.md remote is on github" in by_tool["run_python"]["error"]
