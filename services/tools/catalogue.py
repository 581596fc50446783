"""Which tools this worker serves, and keeping that announced in Redis while it lives.

The orchestrator never imports this package: it reads the catalogue each worker publishes
(``signalbox.shared.tool_contract``), refreshed by a daemon thread in the worker's main process and
withdrawn at shutdown. A worker that dies without withdrawing expires after 3 refreshes.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Mapping

import redis

from signalbox.services.tools import clock, plugins, sandbox, web_fetch, workspace_tools
from signalbox.services.tools.registry import Registry
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.settings import ToolsSettings
from signalbox.shared.tool_contract import ToolSpec, publish_catalogue, withdraw_catalogue

log = logging.getLogger(__name__)

TEST_TOOLS_ENV = "SIGNALBOX_TEST_TOOLS"
TTL_REFRESHES = 3  # a catalogue outlives two missed refreshes, not three


def load_tools(environ: Mapping[str, str] = os.environ, with_sandbox: bool = True) -> Registry:
    """Signalbox's own tools; the test-only tools only when ``SIGNALBOX_TEST_TOOLS=1``.

    ``with_sandbox=False`` (``SIGNALBOX_SANDBOX=off``) leaves ``run_python`` out altogether:
    where the sandbox cannot hold, the tool is not offered rather than run unconfined.
    """
    registries = [workspace_tools.registry, web_fetch.registry, clock.registry]
    if with_sandbox:
        registries.append(sandbox.registry)
    if environ.get(TEST_TOOLS_ENV) == "1":
        from signalbox.services.tools import test_tools

        registries.append(test_tools.registry)
    return Registry.merged(registries)


def worker_tools(settings: ToolsSettings, environ: Mapping[str, str] = os.environ) -> Registry:
    """Every tool a worker serves: its own, the deployment's, its MCP servers', with overrides.

    A deployment tool that does not load fails the worker's start (``ToolLoadError``); an MCP
    server that does not answer is logged and left out, so the other tools stay available.
    """
    own = load_tools(environ, with_sandbox=settings.sandbox == "on")
    registries = [own, *plugins.deployment_registries(settings.tool_modules)]
    if settings.mcp_servers:
        from signalbox.services.tools import (
            mcp_tools,
        )  # the mcp SDK is only imported when configured

        registries.append(mcp_tools.discover(settings.mcp_servers))
    merged = Registry.merged(registries)
    return merged.with_overrides(settings.tool_timeouts, settings.tool_queues)


def served(specs: list[ToolSpec], queues: Iterable[str] | None) -> list[ToolSpec]:
    """The specs whose queue this worker consumes (all of them when that is unknown)."""
    if queues is None:
        return specs
    consumed = set(queues)
    return [s for s in specs if s.queue in consumed]


class CatalogueRefresher:
    """Publishes a worker's specs now and every ``refresh_s`` from a daemon thread."""

    def __init__(
        self,
        client: redis.Redis,
        keys: RedisKeys,
        worker_id: str,
        specs: list[ToolSpec],
        refresh_s: float,
    ) -> None:
        self.client = client
        self.keys = keys
        self.worker_id = worker_id
        self.specs = specs
        self.refresh_s = refresh_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def publish(self) -> None:
        """Announce the catalogue once, valid for ``TTL_REFRESHES`` refresh periods."""
        publish_catalogue(
            self.client, self.keys, self.worker_id, self.specs, self.refresh_s * TTL_REFRESHES
        )

    def _run(self) -> None:
        while not self._stop.wait(self.refresh_s):
            try:
                self.publish()
            except redis.RedisError as exc:  # keep refreshing: Redis may come back
                log.warning("catalogue refresh of %s failed: %s", self.worker_id, exc)

    def start(self) -> None:
        """Publish now and keep refreshing in the background."""
        self.publish()
        self._thread = threading.Thread(target=self._run, name="tools-catalogue", daemon=True)
        self._thread.start()
        log.info("published %d tools as %s", len(self.specs), self.worker_id)

    def stop(self) -> None:
        """Stop refreshing and withdraw the catalogue."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.refresh_s + 1)
        try:
            withdraw_catalogue(self.client, self.keys, self.worker_id)
        except redis.RedisError as exc:  # it expires on its own
            log.warning("catalogue withdrawal of %s failed: %s", self.worker_id, exc)
