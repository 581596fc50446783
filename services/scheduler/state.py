"""The scheduler process's resources (settings, SQL, Redis events, Celery), built once."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from sqlalchemy.orm import Session, sessionmaker

from signalbox.shared.db import make_engine, make_session_factory
from signalbox.shared.event_stream import EventStream
from signalbox.shared.redis_clients import sync_client
from signalbox.shared.redis_keys import RedisKeys
from signalbox.shared.settings import CommonSettings, load


@dataclass(frozen=True)
class SchedulerState:
    """What a tick needs."""

    settings: CommonSettings
    sessions: sessionmaker[Session]
    events: EventStream


@cache
def scheduler_state() -> SchedulerState:
    """Built on first use, in the process that uses it (beat child or worker)."""
    settings = load(CommonSettings)
    sessions = make_session_factory(make_engine(settings.database_url))
    client = sync_client(settings.redis_url)
    return SchedulerState(settings, sessions, EventStream(client, RedisKeys(settings.redis_prefix)))
