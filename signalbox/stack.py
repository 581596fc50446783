"""One Signalbox deployment on this machine: every service as a child process.

``signalbox up`` and the end-to-end tests both run a ``Stack``, so what the tests prove is
what a user starts.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from signalbox.processes import (
    STOP_TIMEOUT_S,
    Child,
    Launch,
    ServiceCommands,
    child_env,
    http_ok,
    log_contains,
    start_together,
    stop_together,
)
from signalbox.redis_server import free_port

HTTP_SERVICES = ("proposals", "gateway")  # every other child of a stack is a Celery worker


@dataclass
class StackConfig:
    """Where a stack keeps its state and how it reaches Redis and SQL."""

    var_dir: Path
    redis_url: str
    database_url: str
    internal_token: str
    redis_prefix: str = "sb:"
    gateway_port: int = 0
    proposals_port: int = 0
    host: str = "127.0.0.1"
    orchestrators: int = 1
    tools_workers: int = 1
    tools_concurrency: int = 4
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def workspaces_root(self) -> Path:
        return self.var_dir / "workspaces"


class Stack:
    """The services of one deployment, started and stopped together."""

    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.gateway_port = config.gateway_port or free_port()
        self.proposals_port = config.proposals_port or free_port()
        self.commands = ServiceCommands(
            host=config.host, tools_concurrency=config.tools_concurrency
        )
        self.children: dict[str, Child] = {}
        self.metrics_ports: dict[str, int] = {}  # each Celery worker's own /metrics port

    @property
    def gateway_url(self) -> str:
        return f"http://{self.config.host}:{self.gateway_port}"

    @property
    def proposals_url(self) -> str:
        return f"http://{self.config.host}:{self.proposals_port}"

    def env(self) -> dict[str, str]:
        """The ``SIGNALBOX_*`` environment every service of this stack gets."""
        c = self.config
        return child_env(
            os.environ,
            {
                "SIGNALBOX_REDIS_URL": c.redis_url,
                "SIGNALBOX_REDIS_PREFIX": c.redis_prefix,
                "SIGNALBOX_DATABASE_URL": c.database_url,
                "SIGNALBOX_WORKSPACES_ROOT": str(c.workspaces_root),
                "SIGNALBOX_INTERNAL_TOKEN": c.internal_token,
                "SIGNALBOX_PROPOSALS_URL": self.proposals_url,
                "SIGNALBOX_ALLOWED_ORIGINS": f'["{self.gateway_url}"]',
                **c.extra_env,
            },
        )

    def metrics_url(self, name: str) -> str:
        """Where the service ``name`` (a child's name) serves Prometheus metrics."""
        if name == "gateway":
            return f"{self.gateway_url}/metrics"
        if name == "proposals":
            return f"{self.proposals_url}/metrics"
        return f"http://{self.config.host}:{self.metrics_ports[name]}/metrics"

    def _child(self, name: str, args: list[str], worker: bool = False) -> Child:
        """A child of this stack (in ``children``), not started yet."""
        env = self.env()
        if worker:  # a Celery worker has no app to serve /metrics on: a port of its own
            port = self.metrics_ports.setdefault(name, free_port())
            env.update(SIGNALBOX_METRICS_PORT=str(port), SIGNALBOX_METRICS_HOST=self.config.host)
            # Each tool worker empties its multiprocess directory at start: never a shared one.
            env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        child = Child(
            name=name,
            args=args,
            log_path=self.config.var_dir / "logs" / f"{name}.log",
            env=env,
        )
        self.children[name] = child
        return child

    # Each ``launch_*`` makes a child and says when it is ready; ``start_*`` starts it alone.

    def launch_proposals(self) -> Launch:
        child = self._child("proposals", self.commands.proposals(self.proposals_port))
        return Launch(child, http_ok(f"{self.proposals_url}/healthz"))

    def launch_gateway(self, after: tuple[str, ...] = ()) -> Launch:
        child = self._child("gateway", self.commands.gateway(self.gateway_port))
        return Launch(child, http_ok(f"{self.gateway_url}/healthz"), after)

    def launch_orchestrator(self, name: str, after: tuple[str, ...] = ()) -> Launch:
        child = self._child(name, self.commands.orchestrator(f"{name}@%h"), worker=True)
        return Launch(child, log_contains(child, " ready."), after)

    def launch_scheduler(self, name: str = "scheduler", after: tuple[str, ...] = ()) -> Launch:
        child = self._child(name, self.commands.scheduler(f"{name}@%h"), worker=True)
        return Launch(child, log_contains(child, " ready."), after)

    def launch_tools_worker(
        self, name: str, queues: str = "tools,tools.sandbox", after: tuple[str, ...] = ()
    ) -> Launch:
        child = self._child(name, self.commands.tools(f"{name}@%h", queues), worker=True)
        return Launch(child, log_contains(child, " ready."), after)

    def start_launches(self, launches: list[Launch]) -> list[Child]:
        """Start these children together (``start_together``); ``stop`` stops them."""
        start_together(launches)
        return [launch.child for launch in launches]

    def start_proposals(self) -> Child:
        return self.start_launches([self.launch_proposals()])[0]

    def start_gateway(self) -> Child:
        return self.start_launches([self.launch_gateway()])[0]

    def start_orchestrator(self, name: str) -> Child:
        return self.start_launches([self.launch_orchestrator(name)])[0]

    def start_scheduler(self, name: str = "scheduler") -> Child:
        return self.start_launches([self.launch_scheduler(name)])[0]

    def start_tools_worker(self, name: str, queues: str = "tools,tools.sandbox") -> Child:
        return self.start_launches([self.launch_tools_worker(name, queues)])[0]

    def start_tools_workers(self, names: list[str], queues: str = "tools,tools.sandbox") -> None:
        """Several tool workers at once (each announces its tools before it is ready)."""
        self.start_launches([self.launch_tools_worker(name, queues) for name in names])

    def start(self) -> None:
        """Start every service and wait until each is ready; on failure stop what started.

        The services start together, so their imports (3 to 6 s of CPU each here) overlap,
        but a service that takes work the moment it is ready starts only once what that
        work needs is ready (a stack restarted over Redis and SQL may find work waiting,
        and nobody can be told to retry it):

        - tool workers after proposals: a write tool run at once (a call redelivered from
          before a restart) posts to the proposals service, and fails if nothing answers
          (docker-compose.yml starts them after it too);
        - orchestrators after every tool worker: a model step offers the tools of the live
          catalogue, which a tool worker publishes before it says ``ready.``; a turn the
          orchestrator resumes at once (its reconciler sweeps at start, a redelivered
          ``run_turn``) would otherwise run with no tools, its calls ending "no live tool
          worker serves it";
        - the scheduler at once: a turn its beat starts goes to the orchestrators' queue
          and waits there, or in SQL, for them (its row names its deployment, so the
          admission pass after an earlier turn of its conversation ends finds it:
          tests/scheduler/test_scheduled_turns.py);
        - the gateway after proposals, as in docker-compose.yml: it checks nothing at start,
          but forwards every proposal request (a reopened web UI asks at once). It is off
          the longest chain (proposals, tool workers, orchestrators), so this
          costs no time.
        """
        self.config.workspaces_root.mkdir(parents=True, exist_ok=True)
        tools = tuple(f"tools{i + 1}" for i in range(self.config.tools_workers))
        orchestrators = tuple(f"orchestrator{i + 1}" for i in range(self.config.orchestrators))
        try:
            start_together(
                [
                    self.launch_proposals(),
                    self.launch_gateway(after=("proposals",)),
                    *(self.launch_tools_worker(name, after=("proposals",)) for name in tools),
                    *(self.launch_orchestrator(name, after=tools) for name in orchestrators),
                    self.launch_scheduler(),
                ]
            )
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop every child: the workers first, so no task is left half-done by a gone
        service. All workers get SIGTERM at once and share one deadline of ``timeout_s``
        before SIGKILL; then the HTTP services the same way."""
        stop_services(self.children.values(), timeout_s)
        self.children.clear()


def stop_services(children: Iterable[Child], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Stop a stack's children: every Celery worker at once (SIGTERM, one shared deadline of
    ``timeout_s``, SIGKILL), then the HTTP services (``HTTP_SERVICES``) the same way."""
    children = list(children)
    stop_together([c for c in children if c.name not in HTTP_SERVICES], timeout_s)
    stop_together([c for c in children if c.name in HTTP_SERVICES], timeout_s)
