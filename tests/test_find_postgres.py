"""The test command's own PostgreSQL: started where none answers, used, stopped."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import psycopg
import pytest

from tests import find_postgres


@pytest.mark.skipif(find_postgres.server_bin() is None, reason="no PostgreSQL server binaries")
def test_a_private_cluster_starts_trusts_postgres_on_loopback_and_stops() -> None:
    # Not pytest's tmp_path: as root the server runs as `postgres`, which must reach the
    # directory, and pytest's are closed to other users.
    directory = Path(tempfile.mkdtemp(prefix="sb-find-pg-"))
    try:
        url = find_postgres.start_private(directory)
        try:
            assert url.startswith("postgresql://postgres@127.0.0.1:")
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute('CREATE DATABASE "sb_probe"')
                row = conn.execute("SHOW synchronous_commit").fetchone()
            assert row == ("off",)
        finally:
            find_postgres.stop_private(directory)
        assert not find_postgres.answers(url)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_nothing_to_find_or_start_is_said_not_raised(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SIGNALBOX_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:1/none")
    assert find_postgres.main([]) == 1
    assert "no PostgreSQL answered at postgresql://postgres@127.0.0.1:1/none" in (
        capsys.readouterr().err
    )
