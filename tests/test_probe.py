"""``signalbox probe``, the health checks docker-compose runs: against a real worker process
and a real HTTP server, healthy and not."""

from __future__ import annotations

import os
import socket
import sys
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from signalbox import probe
from signalbox.cli import main as cli_main
from signalbox.processes import Child, child_env, log_contains
from signalbox.redis_server import free_port
from tests.shared.log_hop_app import HOP_QUEUE


@pytest.fixture(scope="module")
def worker_env(redis_url: str, redis_prefix: str) -> dict[str, str]:
    return {
        "SIGNALBOX_REDIS_URL": redis_url,
        "SIGNALBOX_REDIS_PREFIX": f"{redis_prefix}probe-{uuid.uuid4().hex[:6]}:",
    }


@pytest.fixture(scope="module")
def worker(worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real worker named ``probed@<this host>`` consuming the test queue; yields its name."""
    child = Child(
        name="probed",
        args=[
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.shared.log_hop_app:app",
            "worker",
            "-Q",
            HOP_QUEUE,
            "--pool",
            "threads",
            "-c",
            "1",
            "-n",
            "probed@%h",
            "--without-gossip",
            "--without-mingle",
        ],
        log_path=tmp_path_factory.mktemp("probe") / "worker.log",
        env=child_env(os.environ, {**worker_env, "PYTHONPATH": str(Path.cwd())}),
    )
    child.start()
    try:
        child.wait_ready(log_contains(child, " ready."))
        yield f"probed@{socket.gethostname()}"
    finally:
        child.stop()


@pytest.fixture
def probe_env(monkeypatch: pytest.MonkeyPatch, worker_env: dict[str, str]) -> None:
    for name, value in worker_env.items():
        monkeypatch.setenv(name, value)


def test_worker_probe_passes_for_the_running_worker_by_host_pattern(
    worker: str, probe_env: None
) -> None:
    assert probe.main(["worker", "probed@%h", "--queue", HOP_QUEUE, "--timeout", "5"]) == 0
    assert cli_main(["probe", "worker", worker, "--timeout", "5"]) == 0


def test_worker_probe_fails_for_another_name_or_queue(
    worker: str, probe_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert probe.main(["worker", "absent@%h", "--timeout", "1"]) == 1
    assert "did not answer" in capsys.readouterr().err
    assert probe.main(["worker", worker, "--queue", "orchestrator", "--timeout", "5"]) == 1
    assert "does not consume 'orchestrator'" in capsys.readouterr().err


def test_worker_probe_fails_without_a_broker(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SIGNALBOX_REDIS_URL", f"redis://127.0.0.1:{free_port()}/0")
    assert probe.main(["worker", "any@%h", "--timeout", "1"]) == 1
    assert "probe:" in capsys.readouterr().err


class _Status(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/readyz" else 503)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def http_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Status)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_http_probe_wants_a_200(http_server: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert probe.main(["http", f"{http_server}/readyz"]) == 0
    assert probe.main(["http", f"{http_server}/other"]) == 1
    assert "answered 503" in capsys.readouterr().err
    assert probe.main(["http", f"http://127.0.0.1:{free_port()}/readyz", "--timeout", "1"]) == 1
