"""Schedules and alarms: the SQL truth the beat store (RedBeat, in Redis) is synced from.

Redis keeps nothing on disk here, so every beat start rebuilds its entries from these rows;
``schedule_runs`` holds one row per (schedule, tick time), the key that makes a duplicate
tick (a second beat, a redelivery) unable to start a second turn.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from signalbox.shared.db.models import Base, now


class Schedule(Base):
    """A turn with a fixed prompt, run by ``kind``: ``interval`` | ``at`` | ``cron``."""

    __tablename__ = "schedules"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    kind: Mapped[str] = mapped_column(String(16))
    interval_s: Mapped[int | None] = mapped_column(Integer, default=None)
    at: Mapped[datetime | None] = mapped_column(default=None)
    cron: Mapped[str | None] = mapped_column(String(120), default=None)
    timezone: Mapped[str] = mapped_column(String(64), default="UTC")
    # Active hours in the schedule's time zone, [start, end) in whole hours; null: always.
    active_from_hour: Mapped[int | None] = mapped_column(Integer, default=None)
    active_until_hour: Mapped[int | None] = mapped_column(Integer, default=None)
    prompt: Mapped[str] = mapped_column(Text)
    conversation_id: Mapped[str | None] = mapped_column(
        ForeignKey("conversations.id"), default=None
    )  # null: a new conversation each run
    workspace: Mapped[str | None] = mapped_column(String(100), default=None)
    agent: Mapped[str | None] = mapped_column(String(64), default=None)
    catch_up: Mapped[bool] = mapped_column(Boolean, default=True)
    paused: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(default=now)
    last_tick_at: Mapped[datetime | None] = mapped_column(default=None)


class ScheduleRun(Base):
    """One tick of a schedule: ``started`` (a turn), ``skipped`` or ``failed``."""

    __tablename__ = "schedule_runs"
    __table_args__ = (UniqueConstraint("schedule_id", "tick_at"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    schedule_id: Mapped[str] = mapped_column(
        ForeignKey("schedules.id", ondelete="CASCADE"), index=True
    )
    tick_at: Mapped[datetime] = mapped_column()
    status: Mapped[str] = mapped_column(String(16))
    conversation_id: Mapped[str | None] = mapped_column(String(40), default=None)
    turn_id: Mapped[str | None] = mapped_column(String(40), default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    created_at: Mapped[datetime] = mapped_column(default=now)


class Alarm(Base):
    """A wake-up an agent asked for: ``pending`` → ``fired`` | ``cancelled``."""

    __tablename__ = "alarms"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    conversation_id: Mapped[str] = mapped_column(ForeignKey("conversations.id"), index=True)
    wake_at: Mapped[datetime] = mapped_column()
    note: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    set_by_turn_id: Mapped[str | None] = mapped_column(String(40), default=None)
    turn_id: Mapped[str | None] = mapped_column(String(40), default=None)
    created_at: Mapped[datetime] = mapped_column(default=now)
    fired_at: Mapped[datetime | None] = mapped_column(default=None)
