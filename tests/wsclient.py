"""A small synchronous WebSocket client for tests, speaking PROTOCOL.md frames."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from websockets.sync.client import ClientConnection, connect

Frame = dict[str, Any]


class WsClient:
    """One socket to the gateway; collects every event it receives."""

    def __init__(self, gateway_url: str, token: str, **connect_kwargs: Any) -> None:
        url = gateway_url.replace("http://", "ws://") + "/ws"
        self.conn: ClientConnection = connect(
            url,
            additional_headers={"Authorization": f"Bearer {token}"},
            legacy=True,
            **connect_kwargs,
        )
        self.events: list[Frame] = []
        self.others: list[Frame] = []
        self._req = 0

    def send(self, frame: Frame) -> str:
        """Send a frame with a fresh ``req`` id and return the id."""
        self._req += 1
        req = f"r{self._req}"
        self.conn.send(json.dumps({**frame, "req": req}))
        return req

    def recv(self, deadline: float) -> Frame:
        """The next frame, or ``TimeoutError`` at ``deadline`` (a ``time.monotonic`` value)."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no frame before the deadline")
        frame: Frame = json.loads(self.conn.recv(timeout=remaining))
        if frame.get("type") == "event":
            self.events.append(frame)
        else:
            self.others.append(frame)
        return frame

    def wait_for(self, predicate: Callable[[Frame], bool], timeout_s: float = 30.0) -> Frame:
        """Receive frames until one satisfies ``predicate``."""
        deadline = time.monotonic() + timeout_s
        while True:
            frame = self.recv(deadline)
            if predicate(frame):
                return frame

    def reply_to(self, req: str, timeout_s: float = 10.0) -> Frame:
        """The ``ack``/``error``/``pong`` answering ``req``."""
        return self.wait_for(lambda f: f.get("req") == req and f.get("type") != "event", timeout_s)

    def request(self, frame: Frame, timeout_s: float = 10.0) -> Frame:
        """Send a frame and return its reply."""
        return self.reply_to(self.send(frame), timeout_s)

    def wait_event(self, kind: str, timeout_s: float = 30.0, **data: Any) -> Frame:
        """Receive until an event of ``kind`` whose data contains ``data`` arrives."""

        def match(f: Frame) -> bool:
            if f.get("type") != "event" or f.get("kind") != kind:
                return False
            return all(f["data"].get(k) == v for k, v in data.items())

        already = [e for e in self.events if match(e)]
        if already:
            return already[0]
        return self.wait_for(match, timeout_s)

    def close(self) -> None:
        """Close the socket."""
        self.conn.close()


def kinds(events: list[Frame]) -> list[str]:
    """The kinds of ``events`` in order."""
    return [e["kind"] for e in events]
