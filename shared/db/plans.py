"""The steps of a ``run_plan`` call, each with its own state, so a resumed turn goes on with
the plan where it stopped: a step that ended is never run again.

A step's tool call is an ordinary ``ToolCall`` row of the same turn (``call_id``), marked
with ``ToolCall.plan_call_id`` so the transcript leaves it out: the model sees the plan's
one result, not the calls it was made of.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from signalbox.shared.db.models import Base, now


class PlanStep(Base):
    """One step of a plan: planned → running → ok | error | timeout | skipped."""

    __tablename__ = "plan_steps"
    __table_args__ = (UniqueConstraint("plan_call_id", "save_as"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    plan_call_id: Mapped[str] = mapped_column(ForeignKey("tool_calls.id"), index=True)
    position: Mapped[int] = mapped_column(Integer)  # in the plan's runnable order
    save_as: Mapped[str] = mapped_column(String(40))
    tool: Mapped[str] = mapped_column(String(200))
    input: Mapped[dict[str, Any]] = mapped_column()  # as the model wrote it, references kept
    depends_on: Mapped[list[Any]] = mapped_column()
    level: Mapped[int] = mapped_column(Integer, default=0)
    status: Mapped[str] = mapped_column(String(20), default="planned")
    call_id: Mapped[str | None] = mapped_column(String(40), default=None)  # once it started
    error: Mapped[str | None] = mapped_column(Text, default=None)
    created_at: Mapped[datetime] = mapped_column(default=now)
