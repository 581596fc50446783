"""Engine and session factory; SQLite gets WAL and a busy timeout so services can share it.

A PostgreSQL connection taken from the pool is pinged only when it sat there a while
(``PING_AFTER_IDLE_S``), not at every checkout as ``pool_pre_ping`` does: a turn checks a
connection out some twenty times, back to back, and each ping was a round trip. Statements
that each stand alone can skip the transaction's round trips too (``standalone``).
"""

from __future__ import annotations

import select
import time
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, exc
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import ConnectionPoolEntry, PoolProxiedConnection

SQLITE_BUSY_TIMEOUT_MS = 30_000  # several processes write one SQLite file in `signalbox up`
# A pooled PostgreSQL connection idle at least this long is pinged before it is handed out,
# and replaced if the ping fails: a server restart (or an idle timeout of the server or a
# proxy) left it dead. One used less than this ago is pinged only if the server wrote to
# or closed its socket since (``_hung_up``: what a restart or a terminated backend does);
# else it goes out as it is (docs/operations.md).
PING_AFTER_IDLE_S = 1.0
# A PostgreSQL session idle inside a transaction this long is ended by the server, which
# rolls the transaction back and frees its row locks. A client cut off by a partition
# mid-transaction (an orchestrator host cut from SQL) sends nothing more, and its backend
# would keep the locks until the partition heals or TCP gives up (hours): the turn's next
# runner, on another host, waited on them. No transaction here waits anywhere near this
# long between its statements (docs/operations.md, "A service cut off from PostgreSQL").
IDLE_IN_TRANSACTION_S = 30.0
_CHECKED_IN_AT = "signalbox_checked_in_at"
_POLLRDHUP = getattr(select, "POLLRDHUP", 0)  # Linux: the peer closed its end
_STANDALONE = "_signalbox_standalone"  # the attribute on an engine that keeps its twin


def _normalise(url: str) -> str:
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def make_engine(
    url: str,
    ping_after_idle_s: float = PING_AFTER_IDLE_S,
    idle_in_transaction_s: float = IDLE_IN_TRANSACTION_S,
) -> Engine:
    """An engine for ``url`` (sqlite:///… or postgresql://…); ``ping_after_idle_s`` and
    ``idle_in_transaction_s``: see ``PING_AFTER_IDLE_S`` and ``IDLE_IN_TRANSACTION_S``
    (PostgreSQL; 0 keeps the server's own setting)."""
    url = _normalise(url)
    if url.startswith("sqlite"):
        engine = create_engine(
            url, connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}
        )

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        return engine
    engine = create_engine(url, pool_size=10, max_overflow=20)
    ping_after_idle(engine, ping_after_idle_s)
    if idle_in_transaction_s > 0:
        end_abandoned_transactions(engine, idle_in_transaction_s)
    return engine


def end_abandoned_transactions(engine: Engine, idle_s: float) -> None:
    """Have the server end each of ``engine``'s sessions that sits idle inside a transaction
    for ``idle_s`` (``idle_in_transaction_session_timeout``, set as each connection opens:
    a ``SET``, not a startup option, which PgBouncer refuses)."""
    statement = f"SET idle_in_transaction_session_timeout = {max(1, round(idle_s * 1000))}"

    @event.listens_for(engine, "connect")
    def _set_timeout(dbapi_conn: Any, _record: ConnectionPoolEntry) -> None:
        with dbapi_conn.cursor() as cur:
            cur.execute(statement)
        dbapi_conn.commit()  # the driver opened a transaction for the SET


def ping_after_idle(engine: Engine, idle_s: float) -> None:
    """Ping a pooled connection at checkout when it was checked in ``idle_s`` or more ago,
    or when the server has written to it since (``_hung_up``).

    A failed ping raises ``DisconnectionError``, on which the pool discards the connection
    and checks out a fresh one (SQLAlchemy's pessimistic disconnect handling, by event). A
    connection just opened is not pinged.
    """

    @event.listens_for(engine, "checkin")
    def _checked_in(_dbapi_conn: Any, record: ConnectionPoolEntry) -> None:
        record.info[_CHECKED_IN_AT] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(
        dbapi_conn: Any, record: ConnectionPoolEntry, _proxy: PoolProxiedConnection
    ) -> None:
        checked_in_at = record.info.get(_CHECKED_IN_AT)
        if checked_in_at is None:
            return
        if time.monotonic() - checked_in_at < idle_s and not _hung_up(dbapi_conn):
            return
        try:
            engine.dialect.do_ping(dbapi_conn)
        except engine.dialect.loaded_dbapi.Error as error:
            raise exc.DisconnectionError(f"pooled connection failed its ping: {error}") from error


def _hung_up(dbapi_conn: Any) -> bool:
    """Whether the server wrote to, or closed, a connection that sits in the pool.

    No statement is waiting on a pooled connection, so anything readable on its socket is
    the server's doing: on a restart or a ``pg_terminate_backend`` it sends its goodbye and
    closes (rarely, a parameter status or a notice; the ping that follows then passes). One
    ``poll`` of the socket, no round trip.
    """
    try:
        fd = dbapi_conn.fileno()
    except Exception:  # the driver closed it already: let the ping find out
        return True
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLPRI | _POLLRDHUP)
    return bool(poller.poll(0))


def standalone(engine: Engine) -> Engine:
    """``engine`` for connections whose statements each stand alone: reads, or one write.

    On PostgreSQL they run in autocommit: no ``BEGIN`` before the first statement and no
    ``ROLLBACK`` or ``COMMIT`` after the last, two round trips fewer per use. Each statement
    still sees what was committed when it began, as it does in a transaction at READ
    COMMITTED (the server's default, which these engines keep); a single write is atomic on
    its own. SQLite's driver begins no transaction before a read, so SQLite gets ``engine``.

    The twin shares ``engine``'s pool and is made once, then kept on ``engine`` itself: it
    lives exactly as long as ``engine`` does.
    """
    if engine.dialect.name != "postgresql":
        return engine
    found: Engine | None = getattr(engine, _STANDALONE, None)
    if found is None:
        found = engine.execution_options(isolation_level="AUTOCOMMIT")
        setattr(engine, _STANDALONE, found)
    return found


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions that keep loaded objects usable after commit."""
    return sessionmaker(engine, expire_on_commit=False)


def engine_of(sessions: sessionmaker[Session]) -> Engine:
    """The engine a factory of ``make_session_factory`` is bound to."""
    engine = sessions.kw.get("bind")
    if not isinstance(engine, Engine):  # every factory here: make_session_factory(engine)
        raise TypeError(f"the session factory is bound to {engine!r}, not to an engine")
    return engine


def core(session: Session) -> Connection:
    """``session``'s connection, for Core statements past the ORM's execution layer (its
    compile state costs more than a small statement's own work); what the session holds
    unwritten is flushed first when it autoflushes, as ``Session.execute`` would, so a count
    or a lock sees it. Inside the session's transaction, savepoint included. A Core write
    refreshes no object the session has loaded, and no ORM execution event sees it."""
    if session.autoflush:
        session.flush()
    return session.connection()


def reading(sessions: sessionmaker[Session]) -> Session:
    """A ``Session`` of ``sessions`` for reads alone, on ``standalone``'s engine: on
    PostgreSQL no ``BEGIN`` before them and no ``ROLLBACK`` after (and psycopg forgets every
    statement it prepared on a connection at each ``ROLLBACK``). Nothing it writes is kept
    together: a write belongs in a transaction."""
    return sessions(bind=standalone(engine_of(sessions)))
