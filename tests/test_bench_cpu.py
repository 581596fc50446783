"""The benchmarks' CPU figures from ``/proc`` (``bench.environment``): a process tree's keeps
the children that have ended, and the load run counts PostgreSQL's own CPU in the stack's
(the server's processes, when the server runs on this machine)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from bench.environment import postgres_server_cpu_s, proc_tree_cpu_s
from tests.databases import on_postgres, own_database

# About 0.3 s of one core for the server on a quiet 2-core machine; any machine spends more
# than the 0.05 s asserted (5 clock ticks) on it.
ROWS_SUMMED = 3_000_000
SERVER_WORK_S = 0.05


@pytest.mark.skipif(not on_postgres(), reason="needs SIGNALBOX_DATABASE_URL on PostgreSQL")
def test_a_query_s_cpu_shows_in_the_server_s(tmp_path: Path) -> None:
    with own_database(tmp_path, "dbcpu") as url:
        before = postgres_server_cpu_s(url)
        if before is None:
            pytest.skip("the PostgreSQL server runs on another machine")
        engine = create_engine(url)
        try:
            with engine.connect() as conn:  # open while measured: its backend is alive
                total = conn.execute(
                    text("SELECT sum(i) FROM generate_series(1, :n) AS i"), {"n": ROWS_SUMMED}
                ).scalar_one()
                after = postgres_server_cpu_s(url)
        finally:
            engine.dispose()
    assert total == ROWS_SUMMED * (ROWS_SUMMED + 1) // 2
    assert after is not None
    assert after - before >= SERVER_WORK_S


def test_no_server_cpu_for_sqlite_or_a_server_elsewhere(tmp_path: Path) -> None:
    assert postgres_server_cpu_s(f"sqlite:///{tmp_path / 'x.db'}") is None
    # Not connected to: a server on another host is never read from this machine's /proc.
    assert postgres_server_cpu_s("postgresql://postgres@192.0.2.1:5432/postgres") is None


CHILD_BURNS_S = 0.3  # CPU the ended child spends; its parent's own start-up is far less


def test_a_process_tree_s_cpu_keeps_a_child_that_has_ended() -> None:
    # The parent starts a child that spends CHILD_BURNS_S of CPU and ends, waits for it,
    # says so, and stays alive: the child's CPU is now only in the parent's cutime.
    burn = f"import time\nwhile time.process_time() < {CHILD_BURNS_S}: pass"
    parent_code = (
        "import subprocess, sys\n"
        f"subprocess.run([sys.executable, '-c', {burn!r}], check=True)\n"
        "print('child ended', flush=True)\n"
        "sys.stdin.read()\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        assert parent.stdout.readline().strip() == "child ended"
        assert not _children_alive(parent.pid)
        assert proc_tree_cpu_s([parent.pid]) >= CHILD_BURNS_S
    finally:
        parent.communicate(input="", timeout=30)


def _children_alive(pid: int) -> bool:
    return bool(Path(f"/proc/{pid}/task/{pid}/children").read_text().split())
