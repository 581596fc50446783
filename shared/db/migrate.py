"""Run the Alembic migrations programmatically (``signalbox migrate`` and the tests use this)."""

from __future__ import annotations

import os
from pathlib import Path

from alembic import command
from alembic.config import Config

from signalbox.shared.file_modes import PRIVATE_FILE_MODE

MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(database_url: str) -> Config:
    """An Alembic config pointing at this package's migrations and ``database_url``."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return cfg


def sqlite_file(database_url: str) -> Path | None:
    """The file of a ``sqlite:///path`` URL; None for an in-memory or any other database."""
    if not database_url.startswith("sqlite:///"):
        return None
    path = Path(database_url.removeprefix("sqlite:///").split("?", 1)[0])
    return None if path.name in ("", ":memory:") else path


def upgrade(database_url: str, revision: str = "head") -> None:
    """Bring the database at ``database_url`` up to ``revision``."""
    path = sqlite_file(database_url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Created 0600 before SQLite opens it (its -wal and -shm files take its mode): it
        # holds every user's messages, whatever the umask of whoever runs the migration.
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, PRIVATE_FILE_MODE))
    command.upgrade(alembic_config(database_url), revision)
