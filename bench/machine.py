"""What a figure was measured on: cores, CPU, Python, Redis, the commit, and the fd limits."""

from __future__ import annotations

import os
import platform
import resource
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis

REPO = Path(__file__).resolve().parents[1]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_commit(repo: Path = REPO) -> str:
    """``git rev-parse --short HEAD``, with ``+dirty`` when the tree has changes."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=repo,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=repo,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{commit}+dirty" if dirty else commit


@dataclass(frozen=True)
class Machine:
    """The machine and code a run measured."""

    cores: int
    cpu: str
    python: str
    redis: str
    os: str
    commit: str
    fd_limit: int

    def caption(self) -> str:
        """One line naming the machine and the commit, printed on every figure."""
        return (
            f"{self.cores} cores ({self.cpu}), Python {self.python}, Redis {self.redis}, "
            f"commit {self.commit}"
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON form."""
        return asdict(self)


def describe(redis_url: str) -> Machine:
    """The machine this process runs on, and the version of the Redis at ``redis_url``."""
    client = redis.Redis.from_url(redis_url)
    try:
        info: Any = client.info("server")
        redis_version = str(info.get("redis_version", "unknown"))
    finally:
        client.close()
    return Machine(
        cores=os.cpu_count() or 1,
        cpu=_cpu_model(),
        python=platform.python_version(),
        redis=redis_version,
        os=f"{platform.system()} {platform.release()}",
        commit=git_commit(),
        fd_limit=resource.getrlimit(resource.RLIMIT_NOFILE)[0],
    )


def raise_fd_limit(wanted: int) -> int:
    """Raise this process's soft fd limit towards ``wanted`` (children inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
