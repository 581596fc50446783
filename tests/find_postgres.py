"""Find or start the PostgreSQL the test command runs the whole suite on.

``python -m tests.find_postgres [--start-in DIR]`` prints a server's admin URL and exits 0, or
says why not on stderr and exits 1. It tries, in order: ``SIGNALBOX_TEST_POSTGRES_URL``; a
server on 127.0.0.1:5432 that trusts user ``postgres``; with ``--start-in``, a private cluster
of its own in ``DIR`` (``initdb`` with trust on 127.0.0.1, a free port, no fsync), left running
for ``python -m tests.find_postgres --stop DIR``. The tests then create (and drop) a database
of their own on the server (tests/databases.py), so runs never collide.

PostgreSQL refuses to run as root: as root the private cluster runs as the ``postgres`` user
that Debian's packages create.
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import psycopg

LOCAL_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
CONNECT_TIMEOUT_S = 3
START_TIMEOUT_S = 120


def answers(url: str) -> bool:
    """True when ``url`` accepts a connection and a query."""
    try:
        with psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_S) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def server_bin() -> Path | None:
    """The directory of the newest PostgreSQL server binaries (Debian's layout, else PATH)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _as_server_user() -> list[str]:
    """The prefix that runs a command as the cluster's owner: ``postgres`` when we are root."""
    if os.geteuid() != 0:
        return []
    user = pwd.getpwnam("postgres")  # KeyError: no user to run it as
    return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_private(directory: Path) -> str:
    """Start a cluster of its own in ``directory`` and return its admin URL."""
    bin_dir = server_bin()
    if bin_dir is None:
        raise RuntimeError("no PostgreSQL server binaries (initdb) on this machine")
    run_as = _as_server_user()
    directory.mkdir(parents=True, exist_ok=True)
    if run_as:
        user = pwd.getpwnam("postgres")
        os.chown(directory, user.pw_uid, user.pw_gid)
    data, port = directory / "data", _free_port()
    subprocess.run(
        [*run_as, str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust",
         "--no-sync", "-E", "UTF8"],
        check=True, capture_output=True, timeout=START_TIMEOUT_S,
    )  # fmt: skip
    # The tests kill services, never this server: nothing they check needs the WAL on disk.
    options = (
        f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={directory}"
        " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        " -c max_connections=300"
    )
    subprocess.run(
        [*run_as, str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(directory / "server.log"),
         "-w", "-t", str(START_TIMEOUT_S), "-o", options, "start"],
        check=True, capture_output=True, timeout=START_TIMEOUT_S + 10,
    )  # fmt: skip
    return f"postgresql://postgres@127.0.0.1:{port}/postgres"


def stop_private(directory: Path) -> None:
    """Stop the cluster ``start_private`` started in ``directory`` (nothing if there is none)."""
    bin_dir, data = server_bin(), directory / "data"
    if bin_dir is None or not (data / "postmaster.pid").exists():
        return
    subprocess.run(
        [*_as_server_user(), str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"],
        check=False, capture_output=True, timeout=60,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Print a usable URL, or explain why there is none; or stop a private cluster."""
    parser = argparse.ArgumentParser(prog="python -m tests.find_postgres")
    parser.add_argument("--start-in", type=Path, help="start a private cluster here if need be")
    parser.add_argument("--stop", type=Path, help="stop the private cluster started here")
    args = parser.parse_args(argv)
    if args.stop is not None:
        stop_private(args.stop)
        return 0
    given = os.environ.get("SIGNALBOX_TEST_POSTGRES_URL")
    url = given or LOCAL_URL
    if answers(url):
        print(url)
        return 0
    if given or args.start_in is None:
        print(f"no PostgreSQL answered at {url}", file=sys.stderr)
        return 1
    try:
        private = start_private(args.start_in)
    except (RuntimeError, KeyError, OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        print(f"no PostgreSQL answered at {url}, and none could be started: {exc} "
              f"{detail.decode(errors='replace').strip()}", file=sys.stderr)  # fmt: skip
        return 1
    if not answers(private):
        print(f"a private PostgreSQL was started but does not answer at {private}", file=sys.stderr)
        return 1
    print(private)
    return 0


if __name__ == "__main__":
    sys.exit(main())
