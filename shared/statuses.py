"""The status vocabularies of turns and tool calls, defined once.

Each is a ``StrEnum``: a member *is* its string, so it is stored, compared with what SQL
holds and serialised into events exactly as the bare word was (the wire contract of
docs/protocol.md does not change). Events' own literals (``shared/events.py``) name the
finished subsets.
"""

from __future__ import annotations

from enum import StrEnum


class TurnState(StrEnum):
    """``turns.status``: queued → running ⇄ parked → completed | cancelled | failed | step_limit
    | timed_out | budget_exceeded."""

    QUEUED = "queued"
    RUNNING = "running"
    PARKED = "parked"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    FAILED = "failed"
    STEP_LIMIT = "step_limit"
    TIMED_OUT = "timed_out"  # the turn's wall-clock limit passed (added)
    BUDGET_EXCEEDED = "budget_exceeded"  # the user's token budget ran out mid-turn (added)


# A turn that may still do something: it holds the conversation's turn slot.
UNFINISHED_TURNS = (TurnState.QUEUED, TurnState.RUNNING, TurnState.PARKED)


class CallState(StrEnum):
    """``tool_calls.status``: pending | needs_decision | running | waiting, then one outcome."""

    PENDING = "pending"
    NEEDS_DECISION = "needs_decision"  # a human allows or denies it first
    RUNNING = "running"
    WAITING = "waiting"  # for the human's answer (ask_user) or the client (client tool)
    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    DENIED = "denied"
    CANCELLED = "cancelled"
    LOST = "lost"


class CallDecision(StrEnum):
    """``tool_calls.decision`` of a call that needed one."""

    ALLOW = "allow"
    DENY = "deny"
    EXPIRED = "expired"  # nobody decided in time: the call is denied


class Executor(StrEnum):
    """``tool_calls.executor``: who runs the call."""

    SERVER = "server"  # a tool worker
    CLIENT = "client"  # the user's client (a client tool)
    INLINE = "inline"  # the orchestrator itself (ask_user)


class PlanStepState(StrEnum):
    """``plan_steps.status`` (added): planned → running → ok | error | timeout | skipped
    (| cancelled)."""

    PLANNED = "planned"
    RUNNING = "running"
    OK = "ok"
    ERROR = "error"  # the call ended error, denied, cancelled or lost, or a reference missed
    TIMEOUT = "timeout"
    SKIPPED = "skipped"  # a step it depends on did not end ok: it never ran
    CANCELLED = "cancelled"  # (added) the turn ended (cancelled, timed out…) while it ran
