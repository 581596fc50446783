"""Find a PostgreSQL for the suite's second pass (``python -m tests.find_postgres``).

Prints a URL and exits 0, or says why not on stderr and exits 1. Tries, in order:
``SIGNALBOX_TEST_POSTGRES_URL``; a server on 127.0.0.1:5432 that trusts user ``postgres``;
with ``CI`` set, the machine's own cluster started with ``pg_ctlcluster`` (Debian). The
tests then create (and drop) a database of their own in it, so runs never collide.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg

LOCAL_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
CONNECT_TIMEOUT_S = 3


def answers(url: str) -> bool:
    """True when ``url`` accepts a connection and a query."""
    try:
        with psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_S) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def start_debian_cluster() -> bool:
    """Start the machine's first Debian cluster; True if the command ran cleanly."""
    tool = shutil.which("pg_ctlcluster")
    versions = sorted(Path("/etc/postgresql").glob("*/main")) if tool else []
    if not tool or not versions:
        return False
    version = versions[-1].parent.name
    done = subprocess.run(
        [tool, "--skip-systemctl-redirect", version, "main", "start"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    return done.returncode == 0


def main() -> int:
    """Print a usable URL, or explain why there is none."""
    given = os.environ.get("SIGNALBOX_TEST_POSTGRES_URL")
    candidates = [given] if given else [LOCAL_URL]
    for url in candidates:
        if answers(url):
            print(url)
            return 0
    if not given and os.environ.get("CI") and start_debian_cluster() and answers(LOCAL_URL):
        print(LOCAL_URL)
        return 0
    print(f"no PostgreSQL answered at {candidates[0]}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
