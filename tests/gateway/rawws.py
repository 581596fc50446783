"""A bare-socket WebSocket client that can stop reading: a client library would keep reading.

Only what the tests need: the handshake, masked text frames out, unfragmented frames in.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import time
from typing import Any

OP_TEXT = 0x1
OP_CLOSE = 0x8
OP_PING = 0x9


class RawWebSocket:
    """One client socket with a small receive buffer, so the server's send side fills fast."""

    def __init__(self, host: str, port: int, token: str, rcvbuf: int = 16 * 1024) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # Set before connect: it fixes the advertised window and turns off autotuning.
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(10.0)
        self.sock.connect((host, port))
        key = base64.b64encode(os.urandom(16)).decode()
        request = (
            f"GET /ws HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            f"Sec-WebSocket-Version: 13\r\nAuthorization: Bearer {token}\r\n\r\n"
        )
        self.sock.sendall(request.encode())
        self._buf = b""
        while b"\r\n\r\n" not in self._buf:
            self._buf += self._recv_some()
        head, _, self._buf = self._buf.partition(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0]
        if b" 101 " not in status:
            raise ConnectionError(f"handshake refused: {status!r}")
        self.close_code: int | None = None

    def _recv_some(self) -> bytes:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise EOFError("connection closed")
        return chunk

    def _exactly(self, n: int) -> bytes:
        while len(self._buf) < n:
            self._buf += self._recv_some()
        data, self._buf = self._buf[:n], self._buf[n:]
        return data

    def send_json(self, frame: dict[str, Any]) -> None:
        """Send one masked text frame."""
        payload = json.dumps(frame).encode()
        header = bytes([0x80 | OP_TEXT])
        n = len(payload)
        if n < 126:
            header += bytes([0x80 | n])
        elif n < 65536:
            header += bytes([0x80 | 126]) + struct.pack("!H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack("!Q", n)
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(header + mask + masked)

    def recv_frame(self) -> tuple[int, bytes]:
        """The next frame's opcode and payload (the server never fragments or masks)."""
        b0, b1 = self._exactly(2)
        n = b1 & 0x7F
        if n == 126:
            (n,) = struct.unpack("!H", self._exactly(2))
        elif n == 127:
            (n,) = struct.unpack("!Q", self._exactly(8))
        return b0 & 0x0F, self._exactly(n)

    def read_until_closed(self, deadline_s: float = 30.0) -> list[dict[str, Any]]:
        """Every JSON frame until the server's close frame or EOF; sets ``close_code``."""
        frames: list[dict[str, Any]] = []
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            try:
                opcode, payload = self.recv_frame()
            except EOFError:
                return frames
            if opcode == OP_TEXT:
                frames.append(json.loads(payload))
            elif opcode == OP_CLOSE:
                self.close_code = struct.unpack("!H", payload[:2])[0] if payload else 1005
                return frames
        raise TimeoutError("the server did not close the socket")

    def close(self) -> None:
        """Drop the TCP connection."""
        self.sock.close()
