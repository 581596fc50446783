"""A real Redis Sentinel deployment owned by a test: a master, a replica, three sentinels.

Every process is a ``redis-server`` on a free port of 127.0.0.1 (the sentinels run it with
``--sentinel`` and a generated config), with a short ``down-after-milliseconds`` so a
killed master is failed over within seconds. ``url`` is the ``redis+sentinel://`` URL the
services are given.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from signalbox.processes import wait_until
from signalbox.redis_server import (
    REDIS_START_TIMEOUT_S,
    RedisUnavailable,
    free_port,
    reachable,
    server_binary,
)

MASTER_NAME = "signalbox"
DOWN_AFTER_MS = 1000  # a master silent this long is subjectively down for a sentinel
FAILOVER_TIMEOUT_MS = 5000
QUORUM = 2  # of the 3 sentinels


def sentinel_binary() -> str:
    """A ``redis-server`` that can run as a sentinel; skip (fail under CI) where there is none."""
    binary = server_binary()
    problem = None
    if binary is None:
        problem = "no redis-server to run sentinels with (install redis-server)"
    else:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
        if out.returncode != 0:
            problem = f"{binary} --version failed: {out.stderr.strip()}"
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(problem)
        pytest.skip(problem)
    assert binary is not None
    return binary


@dataclass
class Node:
    """One redis-server process of the deployment."""

    name: str
    port: int
    process: subprocess.Popen[bytes]

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: no shutdown, no last write to the replicas."""
        if self.alive():
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.alive():
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class SentinelCluster:
    """The master, its replica and the sentinels watching them."""

    binary: str
    directory: Path
    master: Node
    replica: Node
    sentinels: list[Node] = field(default_factory=list)

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{MASTER_NAME}/0"

    def nodes(self) -> list[Node]:
        return [self.master, self.replica, *self.sentinels]

    def master_port(self) -> int | None:
        """The master's port as the first answering sentinel reports it."""
        for sentinel in self.sentinels:
            if not sentinel.alive():
                continue
            client = redis.Redis(port=sentinel.port, socket_timeout=1, socket_connect_timeout=1)
            try:
                address: Any = client.sentinel_get_master_addr_by_name(MASTER_NAME)
            except redis.RedisError:
                continue
            finally:
                client.close()
            if address:
                return int(address[1])
        return None

    def wait_in_sync(self, timeout_s: float = 30.0) -> None:
        """Until the replica is connected and every sentinel knows the others and the replica."""

        def synced() -> bool:
            port = self.master_port()  # after a failover, the promoted replica
            if port is None:
                return False
            client = redis.Redis(port=port, socket_timeout=1)
            try:
                info = client.info("replication")
            except redis.RedisError:
                return False
            finally:
                client.close()
            if info.get("connected_slaves", 0) < 1:
                return False
            for sentinel in self.sentinels:
                s = redis.Redis(port=sentinel.port, socket_timeout=1, decode_responses=True)
                try:
                    state: Any = s.sentinel_master(MASTER_NAME)
                    replicas: Any = s.sentinel_slaves(MASTER_NAME)
                except redis.RedisError:
                    return False
                finally:
                    s.close()
                if int(state["num-other-sentinels"]) < len(self.sentinels) - 1:
                    return False
                # A replica the sentinel would promote: up, its link to the master up by its
                # last INFO (a demoted master resyncing reports it down: NOGOODSLAVE).
                if not any(_promotable(replica) for replica in replicas):
                    return False
            return True

        wait_until(synced, timeout_s, "the replica and the sentinels to find each other", 0.1)

    def promoted(self, old_port: int) -> int | None:
        """The new master's port once a failover has moved it off ``old_port``, else None."""
        port = self.master_port()
        if port is None or port == old_port:
            return None
        client = redis.Redis(port=port, socket_timeout=1)
        try:
            role = client.role()
        except redis.RedisError:
            return None
        finally:
            client.close()
        return port if role[0] in (b"master", "master") else None

    def stop(self) -> None:
        for node in reversed(self.nodes()):
            node.stop()


def _promotable(replica: dict[str, Any]) -> bool:
    return (
        bool(replica.get("is_slave"))
        and not replica.get("is_sdown")
        and not replica.get("is_disconnected")
        and replica.get("master-link-status") == "ok"
        and replica.get("master-link-down-time") == 0
    )


def _spawn(name: str, args: list[str], directory: Path) -> subprocess.Popen[bytes]:
    log = open(directory / f"{name}.log", "ab")  # noqa: SIM115 - the child owns it
    process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    return process


def _started(name: str, port: int, process: subprocess.Popen[bytes], directory: Path) -> Node:
    deadline = time.monotonic() + REDIS_START_TIMEOUT_S
    url = f"redis://127.0.0.1:{port}/0"
    while not reachable(url, timeout_s=0.2):
        if process.poll() is not None:
            raise RedisUnavailable(f"{name} exited with {process.returncode}; see {directory}")
        if time.monotonic() > deadline:
            process.kill()
            raise RedisUnavailable(f"{name} did not answer within {REDIS_START_TIMEOUT_S} s")
        time.sleep(0.05)  # polling a child we just started; there is no event to wait on
    return Node(name, port, process)


def _data_node(binary: str, name: str, directory: Path, replica_of: int | None) -> Node:
    port = free_port()
    data = directory / name
    data.mkdir(parents=True, exist_ok=True)
    args = [
        binary,
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--dir", str(data),
        "--maxmemory-policy", "noeviction",
        "--save", "",
        "--appendonly", "no",
    ]  # fmt: skip
    if replica_of is not None:
        args += ["--replicaof", "127.0.0.1", str(replica_of)]
    return _started(name, port, _spawn(name, args, directory), directory)


def _sentinel(binary: str, name: str, directory: Path, master_port: int) -> Node:
    port = free_port()
    config = directory / f"{name}.conf"  # sentinels rewrite their config: a file of its own
    config.write_text(
        f"port {port}\n"
        "bind 127.0.0.1\n"
        f"dir {directory}\n"
        f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} {QUORUM}\n"
        f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n"
        f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n"
        f"sentinel parallel-syncs {MASTER_NAME} 1\n"
    )
    process = _spawn(name, [binary, str(config), "--sentinel"], directory)
    return _started(name, port, process, directory)


def start_sentinel_cluster(directory: Path) -> SentinelCluster:
    """Start the master, the replica and three sentinels; wait until they see each other."""
    binary = sentinel_binary()
    directory.mkdir(parents=True, exist_ok=True)
    master = _data_node(binary, "master", directory, None)
    cluster = SentinelCluster(binary, directory, master, master)
    try:
        cluster.replica = _data_node(binary, "replica", directory, master.port)
        for i in range(3):
            cluster.sentinels.append(_sentinel(binary, f"sentinel{i + 1}", directory, master.port))
        cluster.wait_in_sync()
    except BaseException:
        cluster.stop()
        raise
    return cluster
