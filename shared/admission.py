"""Fair admission of queued turns: which waiting turns may start now, across all users.

A new turn is stored ``queued`` with no ``admitted_at``: it waits in SQL, holding no Celery
message, no worker thread and no slot. An *admission pass* gives free slots to waiting
turns and returns their ids; only then does anyone send ``orchestrator.run_turn`` for them.
A slot is held by an admitted turn that is queued or running; a parked turn (waiting on a
human or a client) holds none, and neither does a finished one.

Who may start, in one pass:

- only the head of its conversation (no earlier unfinished turn): a turn behind another
  would hold a slot doing nothing;
- within its user's limit of running turns (``user_limits.max_running_turns`` over the
  deployment's ``max_running_turns_per_user``) and the deployment's ``max_running_turns``;
- slots go one at a time to the user with the fewest running turns per unit of weight
  (``user_limits.weight``, 1 by default), ties to the user whose waiting turn is oldest: a
  weighted round-robin over the users who wait, in which a user with 200 turns queued gets
  their share and no more, and each user's own turns start in the order they were sent;
- a waiting head whose cancel was asked is admitted at once, outside every limit: its run
  only ends it.

Passes run wherever a slot may have freed or a turn arrived (a gateway storing a turn, an
orchestrator finishing or parking one, a delivery of a turn not yet admitted, and every
reconciler sweep, which mends a wake-up lost to a crash). They serialise on the one row
of ``admission_lock``, so any number of gateways and orchestrators on any number of
machines share one schedule with no scheduler process of its own: SQL is the queue.

A slot that frees with nobody waiting needs no pass: ``anyone_waiting`` (one indexed
``EXISTS``, no lock) says so, and the orchestrator skips the pass after a turn ends or
parks when it is false. That never strands a turn: the check runs after the commit that
freed the slot, so a turn stored after the check is stored after the slot was free, and
the gateway's own pass admits it (or, failing that, the reconciler's sweep); a turn stored
before the check is seen by it, and the pass runs. On SQLite the gateway's pass runs in the
insert's transaction (``admit_in_writer``), whose write lock keeps any slot from freeing
between the pass and its commit; on PostgreSQL it runs after the commit.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, bindparam, exists, func, select, update
from sqlalchemy.orm import Session, aliased

from signalbox.shared.db import AdmissionLock, Turn, UserLimits
from signalbox.shared.db.models import as_utc, now
from signalbox.shared.db.session import core
from signalbox.shared.settings import CommonSettings
from signalbox.shared.statuses import UNFINISHED_TURNS, TurnState

# The statuses of an admitted turn that holds a slot.
HOLDS_SLOT = (TurnState.QUEUED, TurnState.RUNNING)
# Waiting heads read per user per pass when nothing else bounds it.
MAX_HEADS_PER_USER = 1000


@dataclass(frozen=True)
class Limits:
    """The deployment's limits; 0 means none."""

    per_user: int
    deployment: int

    @classmethod
    def of(cls, settings: CommonSettings) -> Limits:
        """The limits a service's settings give."""
        return cls(settings.max_running_turns_per_user, settings.max_running_turns)


@dataclass
class _User:
    limit: int  # 0: none
    weight: int
    running: int = 0
    waiting: deque[tuple[str, datetime]] | None = None

    def may_start(self) -> bool:
        return bool(self.waiting) and (self.limit == 0 or self.running < self.limit)

    def share(self) -> tuple[float, datetime]:
        assert self.waiting
        return self.running / self.weight, self.waiting[0][1]


# A pass's statements are built once, here, with bound parameters: building them cost more
# than running them (``_WAITING_HEADS``' alias and subquery alone took about 1 ms of CPU per
# pass, on the path of every turn a gateway stores). SQLAlchemy memoizes a constant
# statement's cache key, so each execution only binds its values.
_TAKE_LOCK = (
    update(AdmissionLock).where(AdmissionLock.id == 1).values(passes=AdmissionLock.passes + 1)
)


def _lock(session: Session) -> Connection:
    """Hold the admission lock until the transaction ends (created on first use, for a
    database made by ``create_all`` rather than the migrations); returns the session's
    connection, on which the pass runs its Core statements (``core``: the ORM's compile
    state cost more than the statements themselves, on the path of every stored turn)."""
    conn = core(session)
    result: Any = conn.execute(_TAKE_LOCK)
    if not result.rowcount:
        from signalbox.shared.db.concurrency import insert_if_missing

        insert_if_missing(session, AdmissionLock, {"id": 1, "passes": 0}, ["id"])
        conn.execute(_TAKE_LOCK)
    return conn


def admit_in_writer(session: Session, limits: Limits, deployment: str) -> list[str] | None:
    """``admit`` in the transaction of a caller that has written already and holds other
    rows' locks (the gateway's insert of a turn: its conversation's, a first turn's user's),
    where the database allows it without waiting; else None and nothing done, for a pass
    after the caller's commit.

    SQLite: the transaction holds the database's one write lock, so the pass waits on
    nobody, and no other transaction commits between the pass and the caller's commit (a
    slot freed after it is freed after the turn is visible to ``anyone_waiting``).
    PostgreSQL: None. There the admission lock is a row lock, held by a pass while it
    updates turns; waiting for it while holding rows a pass's holder may wait on can
    deadlock, and trying it (``NOWAIT`` in a savepoint) cost more under a burst of turns
    than the transaction it saved (bench/analysis.md, "Issue 20, eighteenth pass")."""
    if session.get_bind().dialect.name != "sqlite":
        return None
    return admit(session, limits, deployment)


# Built once, the deployment bound: asked each time a turn ends.
_ANYONE_WAITING = select(
    select(Turn.id)
    .where(
        Turn.deployment == bindparam("deployment"),
        Turn.status == TurnState.QUEUED,
        Turn.admitted_at.is_(None),
        Turn.parent_call_id.is_(None),
    )
    .exists()
)


def anyone_waiting(db: Session | Connection, deployment: str) -> bool:
    """Whether any of ``deployment``'s turns waits for a slot (one indexed ``EXISTS`` on
    ``ix_turns_waiting``, no lock): when none does, a freed slot needs no pass. On a bare
    connection too (the orchestrator asks it after every turn)."""
    return bool(db.scalar(_ANYONE_WAITING, {"deployment": deployment}))


_RUNNING_BY_USER = (
    select(Turn.user_id, func.count())
    .where(
        Turn.deployment == bindparam("deployment"),
        Turn.admitted_at.is_not(None),
        Turn.status.in_(HOLDS_SLOT),
        Turn.parent_call_id.is_(None),
    )
    .group_by(Turn.user_id)
)


def running_by_user(db: Session | Connection, deployment: str) -> dict[str, int]:
    """``deployment``'s turns holding a slot, by user."""
    rows = db.execute(_RUNNING_BY_USER, {"deployment": deployment})
    return {user_id: int(count) for user_id, count in rows}


def _waiting_heads_statement() -> Any:
    """(turn, user, created, cancel asked) of a deployment's turns that wait and lead their
    conversation, at most ``per_user`` per user (both bound), each user's oldest first."""
    earlier = aliased(Turn)
    ahead = exists().where(
        earlier.conversation_id == Turn.conversation_id,
        earlier.seq < Turn.seq,
        earlier.status.in_(UNFINISHED_TURNS),
        earlier.parent_call_id.is_(None),
    )
    rank = (
        func.row_number()
        .over(partition_by=Turn.user_id, order_by=(Turn.created_at, Turn.id))
        .label("rank")
    )
    heads = (
        select(Turn.id, Turn.user_id, Turn.created_at, Turn.cancel_requested, rank)
        .where(
            Turn.deployment == bindparam("deployment"),
            Turn.status == TurnState.QUEUED,
            Turn.admitted_at.is_(None),
            Turn.parent_call_id.is_(None),
            ~ahead,
        )
        .subquery()
    )
    return (
        select(heads.c.id, heads.c.user_id, heads.c.created_at, heads.c.cancel_requested)
        .where(heads.c.rank <= bindparam("per_user"))
        .order_by(heads.c.created_at, heads.c.id)
    )


_WAITING_HEADS = _waiting_heads_statement()


def _waiting_heads(
    conn: Connection, deployment: str, per_user: int
) -> list[tuple[str, str, datetime, bool]]:
    """(turn, user, created, cancel asked) of ``deployment``'s turns that wait and lead their
    conversation, at most ``per_user`` per user, each user's oldest first."""
    rows = conn.execute(_WAITING_HEADS, {"deployment": deployment, "per_user": per_user})
    return [(t, u, as_utc(c), bool(x)) for t, u, c, x in rows]


_OWN_LIMITS = select(UserLimits.user_id, UserLimits.max_running_turns, UserLimits.weight).where(
    UserLimits.user_id.in_(bindparam("user_ids", expanding=True))
)


def _own_limits(conn: Connection, user_ids: Iterable[str]) -> dict[str, tuple[int | None, int]]:
    rows = conn.execute(_OWN_LIMITS, {"user_ids": list(user_ids)})
    return {u: (limit, max(1, weight or 1)) for u, limit, weight in rows}


_ADOPT_DELIVERED = (
    update(Turn)
    .where(Turn.id == bindparam("delivered"), Turn.deployment.is_(None))
    .values(deployment=bindparam("deployment"))
)

_MARK_ADMITTED = (
    update(Turn)
    .where(and_(Turn.id.in_(bindparam("chosen", expanding=True)), Turn.admitted_at.is_(None)))
    .values(admitted_at=bindparam("admitted_at"))
    .execution_options(synchronize_session=False)
)


_OWN_LIMITS_RANGE = select(
    func.min(UserLimits.max_running_turns), func.max(UserLimits.max_running_turns)
)


def _heads_per_user(conn: Connection, limits: Limits) -> int:
    """How many waiting turns of one user a pass can admit at most."""
    if limits.deployment:
        return limits.deployment
    if limits.per_user:
        lowest, highest = conn.execute(_OWN_LIMITS_RANGE).one()
        if lowest == 0:
            return MAX_HEADS_PER_USER  # someone has no limit of their own
        return max(limits.per_user, highest or 0)
    return MAX_HEADS_PER_USER


def admit(
    session: Session, limits: Limits, deployment: str, delivered: str | None = None
) -> list[str]:
    """One admission pass over ``deployment``'s waiting turns, in ``session``'s transaction:
    mark the turns that may start now admitted and return their ids, in the order they were
    chosen. The caller commits, then sends ``run_turn`` for each (a turn admitted but never
    sent is found by the reconciler's next sweep).

    ``delivered``: a turn whose ``run_turn`` came before its admission; one stored without a
    deployment (a scheduler tick) becomes ``deployment``'s, whose queue delivered it.

    Its writes are Core statements (``core``): a ``Turn`` the session loaded before the pass
    does not see its ``admitted_at`` or ``deployment`` change.
    """
    conn = _lock(session)
    if delivered is not None:
        conn.execute(_ADOPT_DELIVERED, {"delivered": delivered, "deployment": deployment})
    running = running_by_user(conn, deployment)
    total = sum(running.values())
    heads = _waiting_heads(conn, deployment, _heads_per_user(conn, limits))
    if not heads:
        return []
    own = _own_limits(conn, {user_id for _t, user_id, _c, _x in heads})
    users: dict[str, _User] = {}
    chosen: list[str] = []
    for turn_id, user_id, created_at, cancelled in heads:
        if cancelled:
            chosen.append(turn_id)  # its run ends it: no slot, no wait
            continue
        user = users.get(user_id)
        if user is None:
            limit, weight = own.get(user_id, (None, 1))
            user = users[user_id] = _User(
                limit=limits.per_user if limit is None else limit,
                weight=weight,
                running=running.get(user_id, 0),
                waiting=deque(),
            )
        assert user.waiting is not None
        user.waiting.append((turn_id, created_at))
    while not limits.deployment or total < limits.deployment:
        eligible = [u for u in users.values() if u.may_start()]
        if not eligible:
            break
        user = min(eligible, key=_User.share)
        assert user.waiting
        turn_id, _created = user.waiting.popleft()
        user.running += 1
        total += 1
        chosen.append(turn_id)
    if chosen:
        conn.execute(_MARK_ADMITTED, {"chosen": chosen, "admitted_at": now()})
    return chosen


def waiting_by_user(session: Session, deployment: str) -> dict[str, int]:
    """``deployment``'s turns that wait for a slot, by user (heads or not)."""
    rows = session.execute(
        select(Turn.user_id, func.count())
        .where(
            Turn.deployment == deployment,
            Turn.status == TurnState.QUEUED,
            Turn.admitted_at.is_(None),
            Turn.parent_call_id.is_(None),
        )
        .group_by(Turn.user_id)
    )
    return {user_id: int(count) for user_id, count in rows}
