"""The load benchmark counts PostgreSQL's own CPU in the stack's (``bench.environment``):
the server's processes, read from ``/proc`` when the server runs on this machine."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from bench.environment import postgres_server_cpu_s
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
