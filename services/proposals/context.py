"""Everything a request needs, built once at start-up from the service's settings."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import redis
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from signalbox.services.proposals import journal
from signalbox.shared.db import make_engine, make_session_factory
from signalbox.shared.event_stream import EventStream
from signalbox.shared.redis_clients import sync_client
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.settings import ProposalsSettings
from signalbox.shared.workspace_paths import workspace_dir

REDIS_CONNECT_TIMEOUT_S = 2.0
REDIS_TIMEOUT_S = 5.0


@dataclass
class ServiceContext:
    """Settings, SQL sessions, Redis and the event stream of one proposals service."""

    settings: ProposalsSettings
    engine: Engine
    sessions: sessionmaker[Session]
    redis: redis.Redis
    keys: RedisKeys
    events: EventStream

    @classmethod
    def from_settings(cls, settings: ProposalsSettings) -> ServiceContext:
        """Connect to what ``settings`` names (lazily: nothing is contacted yet)."""
        engine = make_engine(settings.database_url)
        # Bounded, because the outbox relay holds an outbox row's lock while it publishes: one
        # try of a command (a client from a URL retries none), at most 2 + 5 s, well under
        # the server's end of a session idle in a transaction (shared/db/session.py).
        client = sync_client(
            settings.redis_url,
            socket_connect_timeout=REDIS_CONNECT_TIMEOUT_S,
            socket_timeout=REDIS_TIMEOUT_S,
        )
        keys = RedisKeys(settings.redis_prefix)
        return cls(
            settings=settings,
            engine=engine,
            sessions=make_session_factory(engine),
            redis=client,
            keys=keys,
            events=EventStream(client, keys),
        )

    def workspace(self, user_id: str, name: str) -> Path:
        """The directory of ``user_id``'s workspace ``name``."""
        return workspace_dir(self.settings.workspaces_root, user_id, name)

    @property
    def journal_root(self) -> Path:
        """Where apply journals are kept: beside the users' directories, in no workspace."""
        return journal.journal_root(self.settings.workspaces_root)

    def close(self) -> None:
        """Release connections."""
        self.redis.close()
        self.engine.dispose()
