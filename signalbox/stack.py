"""One Signalbox deployment on this machine: every service as a child process.

``signalbox up`` and the end-to-end tests both run a ``Stack``, so what the tests prove is
what a user starts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from signalbox.processes import (
    Child,
    ServiceCommands,
    child_env,
    http_ok,
    log_contains,
)
from signalbox.redis_server import free_port


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
        child.start()
        return child

    def start_proposals(self) -> Child:
        child = self._child("proposals", self.commands.proposals(self.proposals_port))
        child.wait_ready(http_ok(f"{self.proposals_url}/healthz"))
        return child

    def start_gateway(self) -> Child:
        child = self._child("gateway", self.commands.gateway(self.gateway_port))
        child.wait_ready(http_ok(f"{self.gateway_url}/healthz"))
        return child

    def start_orchestrator(self, name: str) -> Child:
        child = self._child(name, self.commands.orchestrator(f"{name}@%h"), worker=True)
        child.wait_ready(log_contains(child, " ready."))
        return child

    def start_scheduler(self, name: str = "scheduler") -> Child:
        child = self._child(name, self.commands.scheduler(f"{name}@%h"), worker=True)
        child.wait_ready(log_contains(child, " ready."))
        return child

    def start_tools_worker(self, name: str, queues: str = "tools,tools.sandbox") -> Child:
        child = self._child(name, self.commands.tools(f"{name}@%h", queues), worker=True)
        child.wait_ready(log_contains(child, " ready."))
        return child

    def start(self) -> None:
        """Start every service and wait until each is ready; on failure stop what started."""
        self.config.workspaces_root.mkdir(parents=True, exist_ok=True)
        try:
            self.start_proposals()
            self.start_gateway()
            for i in range(self.config.tools_workers):
                self.start_tools_worker(f"tools{i + 1}")
            for i in range(self.config.orchestrators):
                self.start_orchestrator(f"orchestrator{i + 1}")
            self.start_scheduler()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every child (workers first, so no task is left half-done by a gone service)."""
        for child in reversed(list(self.children.values())):
            child.stop()
        self.children.clear()
