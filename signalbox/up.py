"""``signalbox up``: the whole deployment on one machine, from nothing to a login URL.

State lives under one directory (``./var`` by default): the SQLite file, Redis's data,
the internal token, the admin's token, the workspaces and every service's log. A
restart reuses all of it, so the printed login URL stays the same.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TextIO

from sqlalchemy import select

from signalbox.admin import migrate, safe_url, session_for
from signalbox.agents_cli import ensure_chat_agent
from signalbox.processes import Child, StartError
from signalbox.redis_server import RedisServer, RedisUnavailable, find_or_start_redis
from signalbox.shared.db import User
from signalbox.shared.db.migrate import sqlite_file
from signalbox.shared.db.users import create_user, issue_token, user_for_token
from signalbox.shared.file_modes import (
    PRIVATE_FILE_MODE,
    keep_new_files_private,
    make_private,
    private_dir,
)
from signalbox.shared.settings import CommonSettings, OrchestratorSettings, load
from signalbox.stack import Stack, StackConfig

ADMIN_USER = "admin"
SECRET_FILE_MODE = PRIVATE_FILE_MODE
# What an older `signalbox up` may have left readable by every local user.
STATE_DIRS = ("logs", "workspaces", "redis")
STATE_FILES = ("internal-token", "admin-token")
GATEWAY_URL_FILE = "gateway-url"  # the URL the gateway of the last `up` listens on
SQLITE_SUFFIXES = ("", "-wal", "-shm", "-journal")
# How often the supervisor looks at its children when no SIGCHLD woke it (a backstop only).
SUPERVISE_INTERVAL_S = 1.0


class UpError(RuntimeError):
    """``signalbox up`` cannot start; the message says what to do."""


@dataclass(frozen=True)
class UpOptions:
    """What the operator chose on the command line."""

    port: int = 8000
    proposals_port: int = 0  # 0: any free port
    var_dir: Path = Path("var")
    host: str = "127.0.0.1"
    tools_workers: int = 1


def read_or_create_secret(path: Path, make: Callable[[], str]) -> str:
    """The secret kept in ``path`` (mode 0600), created with ``make()`` on first use."""
    try:
        value = path.read_text().strip()
    except FileNotFoundError:
        value = ""
    if value:
        return value
    path.parent.mkdir(parents=True, exist_ok=True)
    value = make()
    write_secret(path, value)
    return value


def write_secret(path: Path, value: str) -> None:
    """Write ``value`` to ``path`` readable by this user only, replacing any old file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    # Created 0600 from the start: a chmod after writing would leave a window.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, SECRET_FILE_MODE)
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")
    os.replace(tmp, path)


def prepare_var(var: Path, database_url: str) -> None:
    """Make ``var`` and what it holds private to this user: directories 0700, files 0600.

    New files are private through the umask ``run_up`` sets; this narrows what an older
    version created 0755/0644 (the SQLite file with its WAL, the tokens, the logs) and
    the SQLite file wherever ``SIGNALBOX_DATABASE_URL`` puts it.
    """
    private_dir(var)
    for name in STATE_DIRS:
        private_dir(var / name)
    for name in STATE_FILES:
        make_private(var / name)
    for log in (var / "logs").glob("*.log"):
        make_private(log)
    database = sqlite_file(database_url)
    if database is not None:
        for suffix in SQLITE_SUFFIXES:
            make_private(database.with_name(database.name + suffix))


def ensure_admin_token(database_url: str, token_file: Path) -> str:
    """The admin's token: the saved one while it still works, else a new one (saved). The
    user ``admin`` has the admin role (usage of every user, budgets, shares, quotas)."""
    try:
        saved = token_file.read_text().strip()
    except FileNotFoundError:
        saved = ""
    with session_for(database_url) as session:
        if saved and (user := user_for_token(session, saved)) and user.name == ADMIN_USER:
            user.is_admin = True  # the operator of this machine's deployment: /api/admin too
            return saved
        admin = session.scalars(select(User).where(User.name == ADMIN_USER)).one_or_none()
        if admin is None:
            admin, token = create_user(session, ADMIN_USER)
        else:  # the file was lost or its token revoked: the admin gets a fresh one
            token = issue_token(session, admin)
        admin.is_admin = True
    write_secret(token_file, token)
    return token


def model_description(env: dict[str, str]) -> str:
    """One line saying which model turns will use."""
    if not env.get("ANTHROPIC_API_KEY"):
        return "offline demo model (set ANTHROPIC_API_KEY for a real one)"
    model = env.get("SIGNALBOX_MODEL") or OrchestratorSettings.model_fields["model"].default
    base = env.get("ANTHROPIC_BASE_URL") or "https://api.anthropic.com"
    return f"{model} at {base} (ANTHROPIC_API_KEY is set)"


def sandbox_env(env: dict[str, str]) -> tuple[dict[str, str], str]:
    """The tools workers' sandbox setting, and one line saying whether run_python is served.

    A tools worker refuses to start where the sandbox cannot hold (no bubblewrap, not root,
    no memory cgroup). ``up`` asks the same question first (``python -m
    signalbox.services.tools.sandbox``) and, if the answer is no, starts its workers with
    ``SIGNALBOX_SANDBOX=off``, which withdraws run_python, and says so: never unconfined.
    """
    if env.get("SIGNALBOX_SANDBOX") == "off":
        return {}, "run_python off (SIGNALBOX_SANDBOX=off)"
    probe = subprocess.run(
        [sys.executable, "-m", "signalbox.services.tools.sandbox"],
        env=env,
        capture_output=True,
        text=True,
    )
    said = (probe.stdout.strip() or probe.stderr.strip()).splitlines()
    if probe.returncode == 0:
        return {}, "run_python " + (said[-1] if said else "sandboxed")
    why = said[-1] if said else f"the sandbox check exited with status {probe.returncode}"
    return {"SIGNALBOX_SANDBOX": "off"}, f"run_python OFF: the sandbox cannot hold here: {why}"


def _local_origins(host: str, port: int) -> str:
    hosts = {host, "127.0.0.1", "localhost"} if host in {"127.0.0.1", "localhost"} else {host}
    return json.dumps(sorted(f"http://{h}:{port}" for h in hosts))


class Supervisor:
    """Runs a started stack until Ctrl-C, SIGTERM or the death of any child."""

    def __init__(self, stack: Stack, redis: RedisServer, out: TextIO) -> None:
        self.stack = stack
        self.redis = redis
        self.out = out
        self.wake = threading.Event()

    def dead_child(self) -> Child | None:
        """The first child that has exited, if any."""
        for child in self.stack.children.values():
            if not child.alive():
                return child
        return None

    def redis_died(self) -> bool:
        """True when the Redis we started ourselves has exited."""
        return self.redis.process is not None and self.redis.process.poll() is not None

    def run(self) -> int:
        """Block until something ends the stack; returns the exit status for the command."""
        previous = signal.signal(signal.SIGCHLD, lambda _s, _f: self.wake.set())
        try:
            while True:
                self.wake.wait(SUPERVISE_INTERVAL_S)
                self.wake.clear()
                child = self.dead_child()
                if child is not None:
                    code = child.process.returncode if child.process else None
                    print(
                        f"\n{child.name} exited with status {code}; stopping the rest. "
                        f"Last lines of {child.log_path}:\n{child.log_tail()}",
                        file=self.out,
                    )
                    return 1
                if self.redis_died():
                    print(
                        f"\nredis-server exited; stopping. See {self.redis.data_dir}/redis.log",
                        file=self.out,
                    )
                    return 1
        except KeyboardInterrupt:
            return 0
        finally:
            signal.signal(signal.SIGCHLD, previous)


def _raise_interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _say_stopping(_signum: int, _frame: FrameType | None) -> None:
    print("still stopping; each service gets 10 s to finish before it is killed", file=sys.stderr)


def run_up(options: UpOptions, out: TextIO = sys.stdout) -> int:
    """Start everything, print how to log in, supervise until stopped; the exit status."""
    # Before anything is created: every file of this run and of its children is private.
    keep_new_files_private()
    var = options.var_dir.resolve()
    env = dict(os.environ)
    common = load(CommonSettings)
    database_url = env.get("SIGNALBOX_DATABASE_URL") or f"sqlite:///{var / 'signalbox.db'}"
    prepare_var(var, database_url)

    print(f"signalbox: database {safe_url(database_url)}", file=out)
    migrate(database_url)
    internal_token = env.get("SIGNALBOX_INTERNAL_TOKEN") or read_or_create_secret(
        var / "internal-token", lambda: secrets.token_urlsafe(32)
    )
    admin_token = ensure_admin_token(database_url, var / "admin-token")
    if ensure_chat_agent(database_url):  # chat mode, one pick away (docs/operations.md)
        print("signalbox: defined the deployment agent 'chat' (chat mode, no tools)", file=out)

    # SIGTERM must unwind like Ctrl-C: children run in their own sessions, so dying
    # without Stack.stop() would orphan them. SIGINT is set too because a shell starts
    # background jobs with it ignored, and `kill -INT` should still stop the stack.
    previous_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    previous_int = signal.signal(signal.SIGINT, _raise_interrupt)
    redis: RedisServer | None = None
    stack: Stack | None = None
    try:
        try:
            redis = find_or_start_redis(
                env.get("SIGNALBOX_REDIS_URL"), var / "redis", persistent=True
            )
        except RedisUnavailable as exc:
            raise UpError(str(exc)) from None
        where = "found" if redis.process is None else "started"
        print(f"signalbox: redis {where} at {redis.url}", file=out)
        sandbox, sandbox_line = sandbox_env(env)
        print(f"signalbox: {sandbox_line}", file=out)
        stack = Stack(
            StackConfig(
                var_dir=var,
                redis_url=redis.url,
                database_url=database_url,
                internal_token=internal_token,
                redis_prefix=common.redis_prefix,
                gateway_port=options.port,
                proposals_port=options.proposals_port,
                host=options.host,
                tools_workers=options.tools_workers,
                extra_env={
                    "SIGNALBOX_ALLOWED_ORIGINS": env.get("SIGNALBOX_ALLOWED_ORIGINS")
                    or _local_origins(options.host, options.port),
                    **sandbox,
                },
            )
        )
        print(
            "signalbox: starting proposals, gateway, tools, orchestrator, scheduler ...", file=out
        )
        try:
            stack.start()
        except StartError as exc:
            raise UpError(str(exc)) from None
        # `signalbox chat` and `proposals` run from this directory find the gateway here.
        write_secret(var / GATEWAY_URL_FILE, stack.gateway_url)
        print_banner(out, stack, admin_token, model_description(env), var / "logs")
        return Supervisor(stack, redis, out).run()
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGINT, _say_stopping)
        signal.signal(signal.SIGTERM, _say_stopping)
        if stack is not None:
            print("signalbox: stopping ...", file=out)
            stack.stop()
        if redis is not None:
            redis.stop()
        signal.signal(signal.SIGINT, previous_int)
        signal.signal(signal.SIGTERM, previous_term)


def print_banner(out: TextIO, stack: Stack, token: str, model: str, logs: Path) -> None:
    """What the operator needs: where to click, how to log in, which model, where logs go."""
    url = stack.gateway_url
    print(
        "\n".join(
            [
                "",
                "Signalbox is running.",
                f"  web UI:  {url}/#token={token}",
                f"  token:   {token}   (user {ADMIN_USER!r}; also in {logs.parent}/admin-token)",
                f"  model:   {model}",
                f"  logs:    {logs}/",
                f"  metrics: {url}/metrics, {stack.proposals_url}/metrics, workers "
                + ", ".join(f"{name} :{port}" for name, port in stack.metrics_ports.items()),
                f"  API:     {url}/api/...   WebSocket: ws{url.removeprefix('http')}/ws",
                "Press Ctrl-C to stop.",
                "",
            ]
        ),
        file=out,
        flush=True,
    )
