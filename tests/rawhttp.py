"""Bare-socket HTTP/1.1: the request target goes out byte for byte, as an attacker writes it.

A client library normalises what it is given (dot segments, percent-escapes, control
characters refused before sending); the attack tests need exactly their bytes on the wire,
and need to tell an answer from a connection the server dropped without one.
"""

from __future__ import annotations

import json
import select
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

TIMEOUT_S = 10.0


class ConnectionDropped(AssertionError):
    """The server closed the connection without a complete answer."""


@dataclass
class RawResponse:
    """Status, lower-cased headers and body of one answer."""

    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.body)


def _dechunk(data: bytes) -> bytes:
    out = b""
    while True:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return out
        out, data = out + data[:size], data[size + 2 :]


def send(
    base_url: str,
    method: str,
    target: str | bytes,
    headers: Mapping[str, str] | None = None,
    body: bytes | None = None,
    timeout_s: float = TIMEOUT_S,
) -> RawResponse:
    """One request on a fresh connection (``Connection: close``), read to the server's close."""
    url = urlsplit(base_url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    raw_target = target.encode("latin-1") if isinstance(target, str) else target
    lines = [method.encode() + b" " + raw_target + b" HTTP/1.1", f"Host: {host}:{port}".encode()]
    lines += [f"{k}: {v}".encode() for k, v in (headers or {}).items()]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}".encode())
    lines.append(b"Connection: close")
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.sendall(b"\r\n".join(lines) + b"\r\n\r\n" + (body or b""))
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:
            pass  # what was received before the reset still counts; nothing means dropped
    head, sep, payload = received.partition(b"\r\n\r\n")
    if not sep:
        raise ConnectionDropped(f"{method} {raw_target!r}: closed after {received[:200]!r}")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    found = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        found[name.strip().lower()] = value.strip()
    if found.get("transfer-encoding") == "chunked":
        payload = _dechunk(payload)
    elif "content-length" in found and len(payload) < int(found["content-length"]):
        raise ConnectionDropped(f"{method} {raw_target!r}: body cut short")
    return RawResponse(int(status_line.split(" ")[1]), found, payload)


CHUNK_BYTES = 64 * 1024


@dataclass
class Upload:
    """What a client streaming an oversized body saw."""

    status: int | None
    response: bytes
    sent: int


def _wire(
    path: str, port: int, total: int, chunked: bool, headers: dict[str, str]
) -> Iterator[bytes]:
    """The bytes of a POST whose JSON body (``{"text": "xxx…"}``) is about ``total`` long."""
    pieces = total // CHUNK_BYTES
    prefix, suffix = b'{"text": "', b'"}'
    length = len(prefix) + pieces * CHUNK_BYTES + len(suffix)
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {length}"
    extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    yield (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{extra}"
        f"Content-Type: application/json\r\n{framing}\r\n\r\n"
    ).encode()

    def frame(body: bytes) -> bytes:
        return f"{len(body):x}\r\n".encode() + body + b"\r\n" if chunked else body

    yield frame(prefix)
    piece = frame(b"x" * CHUNK_BYTES)
    for _ in range(pieces):
        yield piece
    yield frame(suffix) + (b"0\r\n\r\n" if chunked else b"")


def upload(
    port: int,
    path: str,
    total: int,
    chunked: bool,
    headers: dict[str, str] | None = None,
    timeout_s: float = 30.0,
) -> Upload:
    """POST about ``total`` bytes of JSON to ``path`` as an attacker does, stopping once
    answered.

    A client library sends the whole body before it reads; this one reads while it sends,
    so it sees the answer the server gives part-way, and how much it had sent by then.
    """
    wire = _wire(path, port, total, chunked, headers or {})
    response, sent, pending, writing = b"", 0, b"", True
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.setblocking(False)
        while True:  # until the server closes: its 413 says `Connection: close`
            if writing and not pending and not response:
                pending = next(wire, b"")
            want_write = [sock] if writing and pending and not response else []
            readable, writable, _ = select.select([sock], want_write, [], timeout_s)
            if not readable and not writable:
                break  # no answer within the timeout
            if readable:
                try:
                    data = sock.recv(65536)
                except ConnectionResetError:
                    break
                if not data:
                    break
                response += data
            elif writable:
                try:
                    n = sock.send(pending)
                except (BrokenPipeError, ConnectionResetError):
                    # The server answered and closed while we were still sending: its answer
                    # may be in our receive buffer yet, so read on instead of giving up.
                    writing = False
                    continue
                pending, sent = pending[n:], sent + n
    status = int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/1.1 ") else None
    return Upload(status, response, sent)
