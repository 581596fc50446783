"""The image: built from requirements.lock alone, with git, run as a non-root user; and, where a
Docker engine answers, built for real and driven through one turn with docker-compose.yml.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
BUILD_TIMEOUT_S = 1200
UP_TIMEOUT_S = 300
TURN_TIMEOUT_S = 120


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines and comments folded."""
    text = re.sub(r"\\\n(?:\s*#.*\n)*", " ", DOCKERFILE.read_text())
    result = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            result.append((word.upper(), " ".join(rest.split())))
    return result


def test_python_packages_come_from_the_lock_alone() -> None:
    runs = [args for word, args in _instructions() if word == "RUN" and "pip install" in args]
    assert runs[0] == "pip install --require-hashes -r requirements.lock", runs
    # The project itself: no resolution, no build-time download (its backend is in the lock).
    assert all("--no-deps" in run and "--no-build-isolation" in run for run in runs[1:]), runs
    assert "pip check" in runs[-1]
    copies = [args for word, args in _instructions() if word == "COPY"]
    assert copies[0] == "requirements.lock ./", "the lock must come first (its own layer)"
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    ignored = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert "requirements.lock" not in ignored and "*.lock" not in ignored


def test_the_image_has_git_and_runs_as_a_non_root_user() -> None:
    instructions = _instructions()
    apt = " ".join(
        args for word, args in instructions if word == "RUN" and "apt-get install" in args
    )
    assert re.search(r"\bgit\b", apt), "the proposals service's git features need git"
    assert re.search(r"\bbubblewrap\b", apt), "run_python's sandbox needs bwrap"
    users = [args for word, args in instructions if word == "USER"]
    assert users == ["signalbox"], users
    assert any("useradd" in args and "--uid 10001" in args for _, args in instructions)


def _docker_unavailable() -> str | None:
    docker = shutil.which("docker")
    if docker is None:
        return "docker is not installed"
    done = subprocess.run([docker, "info"], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"no Docker engine answers `docker info` ({last})"
    if subprocess.run([docker, "compose", "version"], capture_output=True).returncode != 0:
        return "docker compose (v2) is not installed"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def compose_project() -> Iterator[tuple[list[str], dict[str, str], int]]:
    """The whole compose deployment, built from this tree, under a project name of its own."""
    reason = _docker_unavailable()
    if reason is not None:
        pytest.skip(f"{reason}: the image is not built here (its Dockerfile is checked above)")
    port = _free_port()
    env = {
        **os.environ,
        "SIGNALBOX_INTERNAL_TOKEN": secrets.token_urlsafe(32),
        "POSTGRES_PASSWORD": secrets.token_urlsafe(24),
        "SIGNALBOX_PORT": str(port),
        "SIGNALBOX_ALLOWED_ORIGINS": f'["http://127.0.0.1:{port}"]',
    }
    env.pop("ANTHROPIC_API_KEY", None)  # the offline demo model: no call leaves the machine
    env.pop("ANTHROPIC_BASE_URL", None)
    project = f"sbtest{secrets.token_hex(4)}"
    compose = ["docker", "compose", "-p", project, "-f", "docker-compose.yml"]
    # tools-sandbox needs privileges a CI engine may refuse; the turn below needs no tool.
    services = ["gateway", "orchestrator", "tools", "proposals", "scheduler"]
    try:
        subprocess.run([*compose, "build"], cwd=ROOT, env=env, check=True, timeout=BUILD_TIMEOUT_S)
        subprocess.run(
            [*compose, "up", "-d", "--wait", *services],
            cwd=ROOT,
            env=env,
            check=True,
            timeout=UP_TIMEOUT_S,
        )
        yield compose, env, port
    finally:
        subprocess.run(
            [*compose, "down", "-v", "--remove-orphans"], cwd=ROOT, env=env, timeout=UP_TIMEOUT_S
        )


def test_the_image_serves_one_turn_through_docker_compose(
    compose_project: tuple[list[str], dict[str, str], int],
) -> None:
    compose, env, port = compose_project
    added = subprocess.run(
        [*compose, "run", "--rm", "migrate", "signalbox", "users", "add", "alice"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=UP_TIMEOUT_S,
    )
    token = added.stdout.strip().splitlines()[-1]
    chat = [sys.executable, "-m", "signalbox.cli", "chat", "--url", f"http://127.0.0.1:{port}"]
    turn = subprocess.run(
        [*chat, "--token", token, "--once", "hello", "--timeout", str(TURN_TIMEOUT_S)],
        capture_output=True,
        text=True,
        timeout=TURN_TIMEOUT_S + 30,
    )
    assert turn.returncode == 0, f"the turn did not complete:\n{turn.stdout}\n{turn.stderr}"
    # git is in the image, as the proposals service runs it.
    git = subprocess.run(
        [*compose, "exec", "-T", "proposals", "git", "--version"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert git.returncode == 0 and git.stdout.startswith("git version"), git.stderr
    whoami = subprocess.run(
        [*compose, "exec", "-T", "gateway", "id", "-u"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert whoami.stdout.strip() == "10001"
