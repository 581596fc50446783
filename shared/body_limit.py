"""Refuse an HTTP request body over the limit while it arrives, before anything buffers it.

uvicorn has no body limit, and a route reads its whole JSON body before validating it, so
a 50 MB body was held in memory whatever its fields said. This ASGI middleware sits in
front of every route of the gateway and of the proposals service, each with its own limit
(``SIGNALBOX_HTTP_MAX_BODY_BYTES``, ``SIGNALBOX_PROPOSALS_MAX_BODY_BYTES``): a
``Content-Length`` over the limit is answered 413 before a byte of the body is read
(uvicorn then sends no ``100 Continue``); a chunked body is counted ``receive()`` by
``receive()`` and refused the moment the count passes the limit. The 413 says
``Connection: close`` so the server drops the rest of the upload instead of reading it to
find the next request.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

PAYLOAD_TOO_LARGE = 413


class BodyTooLarge(HTTPException):
    """Raised from ``receive()`` inside a route: the route's error handling answers 413."""

    def __init__(self, detail: str) -> None:
        super().__init__(PAYLOAD_TOO_LARGE, detail, headers={"Connection": "close"})


def _declared_length(scope: Scope) -> int | None:
    """The request's Content-Length, if it has a usable one (the server refuses a bad one)."""
    for name, value in scope.get("headers", []):
        if name == b"content-length" and value.strip().isdigit():
            return int(value)
    return None


async def _refuse(send: Send, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": PAYLOAD_TOO_LARGE,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """Pure ASGI middleware: HTTP request bodies of at most ``max_bytes``; the 413 names
    ``setting``, the variable that raises the limit. ``paths`` gives a route (by exact
    path) its own ``(max_bytes, setting)`` instead: the gateway's uploads."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        setting: str,
        paths: Mapping[str, tuple[int, str]] | None = None,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.detail = f"request body larger than {max_bytes} bytes ({setting})"
        self.paths = {
            path: (limit, f"request body larger than {limit} bytes ({name})")
            for path, (limit, name) in (paths or {}).items()
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)  # WebSocket frames: uvicorn's ws_max_size
            return
        max_bytes, detail = self.paths.get(scope.get("path", ""), (self.max_bytes, self.detail))
        declared = _declared_length(scope)
        if declared is not None and declared > max_bytes:
            await _refuse(send, detail)
            return
        received = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > max_bytes:
                    raise BodyTooLarge(detail)
            return message

        async def watching_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, watching_send)
        except BodyTooLarge:
            # Raised where no route handled it (e.g. a middleware reading the body).
            if started:
                raise
            await _refuse(send, detail)
