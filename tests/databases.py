"""A migrated SQL database of a test's own, on the server the run was given or in a SQLite file.

With ``SIGNALBOX_DATABASE_URL`` naming a PostgreSQL server, each call creates (and afterwards
drops) a database of its own on it, so fixtures, stacks and parallel runs never share rows;
otherwise a SQLite file in the directory given. ``scripts/test`` runs the whole suite this way
on PostgreSQL, then the suites where SQLite itself matters again on SQLite.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text

from signalbox.shared.db import make_engine
from signalbox.shared.db.migrate import upgrade


def on_postgres() -> bool:
    """True when this run's databases are made on a PostgreSQL server."""
    return os.environ.get("SIGNALBOX_DATABASE_URL", "").startswith("postgres")


@contextmanager
def own_database(directory: Path, purpose: str) -> Iterator[str]:
    """Yield the URL of a fresh, migrated database; drop it (PostgreSQL) when done.

    ``purpose`` names it (letters, digits and ``_``): ``sb{purpose}_{random}`` on PostgreSQL,
    ``{directory}/{purpose}.db`` in SQLite.
    """
    given = os.environ.get("SIGNALBOX_DATABASE_URL", "")
    if not given.startswith("postgres"):
        url = f"sqlite:///{directory / f'{purpose}.db'}"
        upgrade(url)
        yield url
        return
    name = f"sb{purpose}_{uuid.uuid4().hex[:10]}"[:63]
    server = make_engine(given).url.render_as_string(hide_password=False)
    admin: Engine = create_engine(server, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
            # A commit need not wait for its WAL to reach the disk (about 2 ms here): the
            # tests kill services, never the server, so nothing they check is lost by it
            # (as SQLite's synchronous=NORMAL, which make_engine sets).
            conn.execute(text(f'ALTER DATABASE "{name}" SET synchronous_commit = off'))
        url = make_engine(given).url.set(database=name).render_as_string(hide_password=False)
        try:
            upgrade(url)
            yield url
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def database_for(request: pytest.FixtureRequest, directory: Path, purpose: str) -> str:
    """``own_database`` for a fixture: the URL now, the drop when the fixture's scope ends.

    Registered during the fixture's set-up, the drop runs after the fixture's own teardown
    (a stack stopped first, then its database dropped).
    """
    dropped = ExitStack()
    url = dropped.enter_context(own_database(directory, purpose))
    request.addfinalizer(dropped.close)
    return url
