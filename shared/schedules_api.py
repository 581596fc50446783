"""The shapes of ``/api/schedules`` and ``/api/alarms``: the gateway answers with them and
the SDK (``signalbox/client``) reads them, so they live here, once."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

# A schedule may tick at most once a second (the beat's resolution).
MIN_INTERVAL_S = 1

ScheduleKind = Literal["interval", "at", "cron"]


class ScheduleIn(BaseModel):
    """``POST /api/schedules``."""

    kind: ScheduleKind
    prompt: str = Field(min_length=1, max_length=20_000)
    name: str = Field(default="", max_length=200)
    interval_s: int | None = Field(default=None, ge=MIN_INTERVAL_S, le=366 * 86_400)
    at: datetime | None = None
    cron: str | None = Field(default=None, max_length=120)
    timezone: str = Field(default="UTC", max_length=64)
    active_from_hour: int | None = None
    active_until_hour: int | None = None
    conversation_id: str | None = Field(default=None, max_length=40)
    workspace: str | None = Field(default=None, max_length=100)
    agent: str | None = Field(default=None, max_length=64)
    catch_up: bool = True


class SchedulePatch(BaseModel):
    """``PATCH /api/schedules/{id}``: pause or resume, or a new prompt."""

    paused: bool | None = None
    prompt: str | None = Field(default=None, min_length=1, max_length=20_000)
    catch_up: bool | None = None


class ScheduleOut(BaseModel):
    """A schedule."""

    id: str
    name: str
    kind: ScheduleKind
    interval_s: int | None
    at: datetime | None
    cron: str | None
    timezone: str
    active_from_hour: int | None
    active_until_hour: int | None
    prompt: str
    conversation_id: str | None
    workspace: str | None
    agent: str | None
    catch_up: bool
    paused: bool
    created_at: datetime
    last_tick_at: datetime | None


class ScheduleRunOut(BaseModel):
    """One tick: ``started`` (a turn), ``skipped`` (outside active hours) or ``failed``."""

    tick_at: datetime
    status: str
    conversation_id: str | None
    turn_id: str | None
    error: str | None
    created_at: datetime


class AlarmOut(BaseModel):
    """An alarm an agent set: ``pending`` | ``fired`` | ``cancelled`` | ``failed``."""

    id: str
    conversation_id: str
    wake_at: datetime
    note: str
    status: str
    turn_id: str | None
    created_at: datetime
    fired_at: datetime | None
