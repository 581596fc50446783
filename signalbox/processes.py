"""Child processes of one Signalbox stack: start, wait until ready, stop the whole group.

Several children start and stop together (``start_together``, ``stop_together``): each
service spends seconds of CPU importing, and one after the other a stack took 17 s to start.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0  # a warm shutdown's time, after SIGTERM, before SIGKILL
POLL_INTERVAL_S = 0.01
READY_POLL_INTERVAL_S = 0.05  # a readiness check may cost the child being waited for CPU

T = TypeVar("T")


def wait_until(
    check: Callable[[], T],
    timeout_s: float,
    what: str = "condition",
    interval_s: float = POLL_INTERVAL_S,
) -> T:
    """Poll ``check`` (the state of another thread or process) until it returns something
    truthy, and return that; ``TimeoutError`` naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s} s")
        time.sleep(interval_s)  # no event to wait on across processes: polled, with a deadline


class StartError(RuntimeError):
    """A child did not become ready; the message holds the tail of its log."""


@dataclass
class Child:
    """One service process; its output goes to ``log_path``."""

    name: str
    args: list[str]
    log_path: Path
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    log_start: int = 0  # where this run's output begins in the (appended) log

    def start(self) -> None:
        """Start the child in its own session so that stopping it stops its workers too."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            # Logs are appended across restarts; a marker keeps a log tail from mixing runs.
            log.write(
                f"--- {self.name} starting at {time.strftime('%Y-%m-%d %H:%M:%S')} ---\n".encode()
            )
            log.flush()
            self.log_start = log.tell()
            self.process = subprocess.Popen(
                self.args,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        """The child's pid (also its process-group id)."""
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        """True while the child runs."""
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the child's output."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no output)"

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the child's whole process group."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM the group, then SIGKILL what is left after ``timeout_s``."""
        stop_together([self], timeout_s)

    def poll_ready(self, check: Callable[[], bool]) -> bool:
        """``check`` once; ``StartError`` with the log tail if the child has exited."""
        if not self.alive():
            raise StartError(f"{self.name} exited during start-up:\n{self.log_tail()}")
        return check()

    def not_ready(self, timeout_s: float) -> StartError:
        """The error of a child not ready within ``timeout_s``, with its log tail."""
        return StartError(f"{self.name} not ready within {timeout_s} s:\n{self.log_tail()}")

    def wait_ready(self, check: Callable[[], bool], timeout_s: float = READY_TIMEOUT_S) -> None:
        """Poll ``check`` until it holds, failing early if the child exits."""
        try:
            wait_until(lambda: self.poll_ready(check), timeout_s, self.name, READY_POLL_INTERVAL_S)
        except TimeoutError:
            raise self.not_ready(timeout_s) from None


@dataclass(frozen=True)
class Launch:
    """A child to start, how to tell it is ready, and the children that must be ready first."""

    child: Child
    ready: Callable[[], bool]
    after: tuple[str, ...] = ()  # names of other children of the same start
    timeout_s: float = READY_TIMEOUT_S  # from this child's own start


def start_together(
    launches: Sequence[Launch], on_start: Callable[[Child], None] | None = None
) -> None:
    """Start every child as soon as those it comes ``after`` are ready; return when all are.

    Children with nothing to wait for start at once, so their start-ups overlap. Each child
    has ``timeout_s`` from its own start. ``StartError`` (with that child's log tail) as soon
    as one exits or misses its deadline; the children already started keep running, for the
    caller to stop. ``on_start`` is told of each child as it starts.
    """
    names = {launch.child.name for launch in launches}
    if len(names) != len(launches):
        raise ValueError("two children of one start share a name")
    for launch in launches:
        unknown = set(launch.after) - names
        if unknown or launch.child.name in launch.after:
            raise ValueError(f"{launch.child.name} comes after {sorted(launch.after)}: unknown")
    waiting = list(launches)  # not started yet
    starting: list[tuple[Launch, float]] = []  # started, not ready yet: with its deadline
    ready: set[str] = set()
    while waiting or starting:
        startable = [w for w in waiting if ready.issuperset(w.after)]
        if not startable and not starting:
            raise ValueError(f"a cycle among {sorted(w.child.name for w in waiting)}")
        for launch in startable:
            waiting.remove(launch)
            launch.child.start()
            if on_start is not None:
                on_start(launch.child)
            starting.append((launch, time.monotonic() + launch.timeout_s))
        for launch, deadline in list(starting):
            if launch.child.poll_ready(launch.ready):
                ready.add(launch.child.name)
                starting.remove((launch, deadline))
            elif time.monotonic() > deadline:
                raise launch.child.not_ready(launch.timeout_s)
        if starting:
            time.sleep(READY_POLL_INTERVAL_S)  # other processes' start-up: polled, with deadlines


def stop_together(children: Iterable[Child], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM every child's group at once, wait for all of them until one shared deadline,
    then SIGKILL each group (Celery prefork children outlive a killed parent) and reap."""
    started = [child for child in children if child.process is not None]
    for child in started:
        child.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for child in started:
        assert child.process is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
    for child in started:
        assert child.process is not None
        child.signal_group(signal.SIGKILL)
        if child.process.poll() is None:
            child.process.wait()


def http_ok(url: str) -> Callable[[], bool]:
    """A readiness check: ``url`` answers 200.

    By ``http.client``, one short connection per check: an httpx client per check built a TLS
    context each time (0.1 to 0.3 s of CPU with OpenSSL 3 on a loaded machine), taken every
    50 ms from the very process being waited for.
    """
    parts = urllib.parse.urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    https = parts.scheme == "https"

    def check() -> bool:
        conn: http.client.HTTPConnection
        if https:
            conn = http.client.HTTPSConnection(parts.hostname or "", parts.port, timeout=1.0)
        else:
            conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=1.0)
        try:
            conn.request("GET", path)
            return conn.getresponse().status == 200
        except (OSError, http.client.HTTPException):
            return False
        finally:
            conn.close()

    return check


def log_contains(child: Child, text: str) -> Callable[[], bool]:
    """A readiness check: the child's log contains ``text`` (Celery prints ``ready.``)."""

    def check() -> bool:
        try:
            with open(child.log_path, "rb") as log:
                log.seek(child.log_start)  # a restart must not see the last run's "ready."
                return text in log.read().decode(errors="replace")
        except FileNotFoundError:
            return False

    return check


def python_module(module: str, *args: str) -> list[str]:
    """``python -m module args`` with this interpreter."""
    return [sys.executable, "-m", module, *args]


@dataclass
class ServiceCommands:
    """The command line of each service; docker-compose.yml runs the same entry points.

    The workers send task events (``-E``) for Flower and ``celery events``; a tool call's
    event shows only its call id and tool (``kwargsrepr`` in orchestrator/dispatch.py).
    ``--loglevel`` is Celery's; ``SIGNALBOX_LOG_LEVEL`` decides (shared/log_config.py).
    """

    host: str = "127.0.0.1"
    tools_concurrency: int = 4
    orchestrator_concurrency: int = 8
    scheduler_concurrency: int = 2

    def gateway(self, port: int) -> list[str]:
        # Its own entry point, not the uvicorn command: the server's read limits come from
        # the gateway's settings there (services/gateway/app.py, server_config).
        return python_module(
            "signalbox.services.gateway.app", "--host", self.host, "--port", str(port),
        )  # fmt: skip

    def proposals(self, port: int) -> list[str]:
        # Its own entry point, as the gateway's: the body limit and umask are set in main().
        return python_module(
            "signalbox.services.proposals.app", "--host", self.host, "--port", str(port)
        )

    def orchestrator(self, name: str) -> list[str]:
        return python_module(
            "celery", "-A", "signalbox.services.orchestrator.worker:app", "worker",
            "-Q", "orchestrator", "--pool", "threads",
            "-c", str(self.orchestrator_concurrency), "-n", name, "--without-gossip",
            "--without-mingle", "-E", "--loglevel", "INFO",
        )  # fmt: skip

    def scheduler(self, name: str) -> list[str]:
        # A worker with an embedded beat (-B): RedBeat's Redis lock lets any number of them
        # run with one beat ticking (services/scheduler/worker.py).
        return python_module(
            "celery", "-A", "signalbox.services.scheduler.worker:app", "worker", "-B",
            "-Q", "scheduler", "--pool", "threads",
            "-c", str(self.scheduler_concurrency), "-n", name, "--without-gossip",
            "--without-mingle", "-E", "--loglevel", "INFO",
        )  # fmt: skip

    def tools(self, name: str, queues: str = "tools,tools.sandbox") -> list[str]:
        return python_module(
            "celery", "-A", "signalbox.services.tools.worker:app", "worker",
            "-Q", queues, "--pool", "prefork",
            "-c", str(self.tools_concurrency), "-n", name, "--without-gossip",
            "--without-mingle", "-E", "--loglevel", "INFO",
        )  # fmt: skip


def child_env(base: Mapping[str, str], overrides: Mapping[str, str]) -> dict[str, str]:
    """The environment of a child: ``base`` plus ``overrides``, unbuffered output."""
    env = dict(base)
    env.update(overrides)
    env["PYTHONUNBUFFERED"] = "1"
    return env
