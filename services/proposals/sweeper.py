"""The periodic sweep: publish outbox rows a failed relay left behind, expire overdue proposals,
and roll back applies a killed process (maybe another instance) left half-done.

A decision committed while Redis was down is durable but unannounced; the relay after the
next decision would send it, but a quiet service has no next decision. This thread runs
the relay every ``outbox_sweep_s`` so it goes out soon after Redis is back.
"""

from __future__ import annotations

import logging
import threading

from signalbox.services.proposals import decisions, outbox, recovery
from signalbox.services.proposals.context import ServiceContext

log = logging.getLogger(__name__)

JOIN_TIMEOUT_S = 10.0  # a relay stuck on a dead Redis socket must not hold shutdown forever


class Sweeper:
    """A daemon thread that sweeps every ``interval_s`` until ``stop()``."""

    def __init__(self, ctx: ServiceContext, interval_s: float) -> None:
        self.ctx = ctx
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="proposals-sweeper", daemon=True)

    def start(self) -> None:
        """Start sweeping."""
        self._thread.start()

    def stop(self) -> None:
        """Stop after the sweep in progress, if any."""
        self._stop.set()
        self._thread.join(timeout=JOIN_TIMEOUT_S)

    def sweep_once(self) -> int:
        """One sweep; how many outbox messages it sent."""
        try:
            recovery.recover(self.ctx)
        except Exception:
            log.exception("settling apply journals failed; the next sweep retries")
        try:
            decisions.expire_overdue(self.ctx)
        except Exception:
            log.exception("expiring overdue proposals failed; the next sweep retries")
        return outbox.relay(self.ctx)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                sent = self.sweep_once()
            except Exception:
                log.exception("outbox sweep failed; the next sweep retries")
                continue
            if sent:
                log.info("outbox sweep sent %d message(s)", sent)
