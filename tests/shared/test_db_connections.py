"""Pooled connections (shared/db/session.py): a connection the server dropped while it sat in
the pool is replaced before use; a standalone connection (autocommit on PostgreSQL) leaves
no trace on the pooled connection the next transaction gets; the turn loop's reads keep the
statements psycopg prepared on their connection."""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, exc, text
from sqlalchemy.pool import QueuePool

from signalbox.services.orchestrator import store
from signalbox.shared.db import make_engine, make_session_factory, standalone
from signalbox.shared.db.session import IDLE_IN_TRANSACTION_S
from tests.databases import on_postgres, own_database

on_postgres_only = pytest.mark.skipif(
    not on_postgres(), reason="pings and autocommit are PostgreSQL's (SIGNALBOX_DATABASE_URL)"
)
GONE_DEADLINE_S = 10.0
GONE_POLL_S = 0.01


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with own_database(tmp_path_factory.mktemp("connections"), "connections") as found:
        yield found


@pytest.fixture
def engine(url: str) -> Iterator[Engine]:
    """An engine of ``make_engine``'s defaults, disposed after the test."""
    made = make_engine(url)
    yield made
    made.dispose()


def _backend_pid(engine: Engine) -> int:
    with engine.connect() as conn:
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
    assert isinstance(pid, int)
    return pid


def _terminate(url: str, pid: int) -> None:
    """End backend ``pid`` from another connection, as a server restart would, and wait
    until the server no longer lists it."""
    admin = make_engine(url)
    try:
        with standalone(admin).connect() as conn:
            assert conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar()
            deadline = time.monotonic() + GONE_DEADLINE_S
            listed = text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid")
            while conn.execute(listed, {"pid": pid}).scalar_one():
                assert time.monotonic() < deadline, f"backend {pid} still listed"
                time.sleep(GONE_POLL_S)
    finally:
        admin.dispose()


@on_postgres_only
@pytest.mark.parametrize(
    "ping_after_idle_s",
    [
        # Every reused connection counts as idle: pinged for its age.
        pytest.param(0.0, id="dropped-while-idle"),
        # Checked in moments ago, so not pinged for its age: what the server wrote to its
        # socket on the way out (its goodbye, then the close) is what gets it pinged.
        pytest.param(3600.0, id="dropped-just-after-use"),
    ],
)
def test_a_connection_the_server_dropped_in_the_pool_is_replaced_before_use(
    url: str, ping_after_idle_s: float
) -> None:
    engine = make_engine(url, ping_after_idle_s=ping_after_idle_s)
    try:
        first = _backend_pid(engine)
        _terminate(url, first)
        assert _backend_pid(engine) != first  # no error: the ping found it dead
    finally:
        engine.dispose()


@on_postgres_only
def test_a_connection_used_moments_ago_goes_out_without_a_ping(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The point of pinging only after an idle second: a turn's back-to-back checkouts cost
    # no round trip each. Counted at the dialect's ping, which every ping goes through.
    engine = make_engine(url, ping_after_idle_s=3600.0)
    pings: list[Any] = []
    ping = engine.dialect.do_ping

    def counted(dbapi_conn: Any) -> bool:
        pings.append(dbapi_conn)
        return ping(dbapi_conn)

    monkeypatch.setattr(engine.dialect, "do_ping", counted)
    try:
        first = _backend_pid(engine)
        for _ in range(5):
            assert _backend_pid(engine) == first  # the same pooled connection each time
        assert pings == []
        engine.pool.dispose()
        with engine.connect() as conn:  # a new connection: not pinged either
            conn.execute(text("SELECT 1"))
        assert pings == []
    finally:
        engine.dispose()


@on_postgres_only
def test_the_standalone_engine_is_made_once_and_freed_with_its_engine(url: str) -> None:
    engine = make_engine(url)
    twin = standalone(engine)
    assert standalone(engine) is twin
    assert twin.pool is engine.pool  # one pool: the twin opens no connections of its own
    gone = weakref.ref(engine)
    del engine, twin
    gc.collect()
    assert gone() is None


@on_postgres_only
def test_a_standalone_read_leaves_no_transaction_open(engine: Engine) -> None:
    with standalone(engine).connect() as conn:
        conn.execute(text("SELECT 1"))
        dbapi = conn.connection.dbapi_connection
        assert dbapi is not None
        # In a transaction the read would have opened one (INTRANS); autocommit: IDLE.
        assert dbapi.info.transaction_status.name == "IDLE"


def test_a_transaction_on_a_connection_a_standalone_use_returned_still_rolls_back(
    engine: Engine,
) -> None:
    # Used one after the other, the pool hands the transaction the very connection the
    # standalone write ran on: had autocommit stayed on it, the failed insert would stay.
    table = f"standalone_probe_{time.monotonic_ns()}"
    with engine.begin() as conn:
        conn.execute(text(f"CREATE TABLE {table} (x INTEGER)"))
    with standalone(engine).connect() as conn:
        conn.execute(text(f"INSERT INTO {table} VALUES (1)"))
        conn.commit()  # SQLite's: standalone is the plain engine there
        used = conn.connection.dbapi_connection
    with pytest.raises(RuntimeError), engine.begin() as conn:
        assert conn.connection.dbapi_connection is used
        conn.execute(text(f"INSERT INTO {table} VALUES (2)"))
        raise RuntimeError("the transaction fails after its insert")
    with engine.connect() as conn:
        kept = conn.execute(text(f"SELECT x FROM {table} ORDER BY x")).scalars().all()
    assert kept == [1]  # the standalone write stays; the failed transaction's does not


@on_postgres_only
def test_the_turn_loops_reads_keep_the_statements_their_connection_prepared(
    engine: Engine,
) -> None:
    # psycopg prepares a statement on a connection after its fifth run there, and forgets
    # them all at any ROLLBACK: a read that ended its transaction so never ran prepared.
    sessions = make_session_factory(engine)
    for _ in range(8):  # one after the other: the pool's one connection each time
        assert store.load_turn(sessions, "turn_absent") is None
        assert store.open_calls(sessions, "turn_absent") == []
        with pytest.raises(LookupError):
            store.loop_state(sessions, "turn_absent", "turn_absent")
    with standalone(engine).connect() as conn:
        prepared = conn.execute(text("SELECT statement FROM pg_prepared_statements"))
        statements = prepared.scalars().all()
    pool = engine.pool
    assert isinstance(pool, QueuePool) and pool.checkedin() == 1  # one connection for all
    assert len(statements) == 3, statements


@on_postgres_only
def test_a_transaction_its_client_abandoned_gives_its_row_locks_up(url: str) -> None:
    # A client cut off by a partition inside a transaction (an orchestrator host cut from
    # SQL mid-step) sends nothing more: to the server, a session idle in its transaction.
    # It once kept its row locks until the partition healed, and the turn's next runner, on
    # another host, waited on them. Now the server ends such a session and rolls it back.
    table = f"abandoned_probe_{time.monotonic_ns()}"
    cut_off = make_engine(url, idle_in_transaction_s=1.0)
    other = make_engine(url)
    try:
        with other.begin() as conn:
            conn.execute(text(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, n INTEGER)"))
            conn.execute(text(f"INSERT INTO {table} VALUES (1, 0)"))
        held = cut_off.connect()
        held.execute(text(f"UPDATE {table} SET n = 100 WHERE id = 1"))  # locked; then silence
        with other.begin() as conn:
            # The deadline: far longer than the timeout, and it raises instead of hanging.
            conn.execute(text("SET LOCAL lock_timeout = '20s'"))
            conn.execute(text(f"UPDATE {table} SET n = n + 1 WHERE id = 1"))
        with other.connect() as conn:
            assert conn.execute(text(f"SELECT n FROM {table}")).scalar_one() == 1  # no 100
        with pytest.raises(exc.DBAPIError) as ended:
            held.execute(text("SELECT 1"))
        assert ended.value.connection_invalidated  # the pool drops it, never reuses it
        held.close()
    finally:
        cut_off.dispose()
        other.dispose()


@on_postgres_only
def test_every_engine_asks_the_server_to_end_abandoned_transactions(engine: Engine) -> None:
    with engine.connect() as conn:
        found = conn.execute(text("SHOW idle_in_transaction_session_timeout")).scalar_one()
    assert found == f"{round(IDLE_IN_TRANSACTION_S)}s"
