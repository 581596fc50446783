"""Fair admission (shared/admission.py) over real SQL: limits, weights, order, deployments,
and passes racing from several threads (SQLite here; PostgreSQL in the test command's
PostgreSQL lane)."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from signalbox.services.orchestrator.store import standalone_connection
from signalbox.shared.admission import Limits, admit, anyone_waiting, waiting_by_user
from signalbox.shared.db import Conversation, Turn, UserLimits
from signalbox.shared.db.models import now
from signalbox.shared.ids import new_id
from signalbox.shared.statuses import TurnState

Users = Callable[[], tuple[str, str]]


class Queue:
    """Turns of one deployment, stored as the gateway stores them, created in order."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions
        self.deployment = f"test-{uuid.uuid4().hex[:8]}:"
        self.clock = now() - timedelta(hours=1)

    def conversation(self, user_id: str) -> str:
        with self.sessions() as s, s.begin():
            conv = Conversation(id=new_id("conv"), user_id=user_id, workspace="default")
            s.add(conv)
        return conv.id

    def turn(
        self, user_id: str, conversation_id: str | None = None, seq: int = 1, **values: object
    ) -> str:
        """A turn; each one created a millisecond after the one before."""
        self.clock += timedelta(milliseconds=1)
        with self.sessions() as s, s.begin():
            turn = Turn(
                id=new_id("turn"),
                conversation_id=conversation_id or self.conversation(user_id),
                user_id=user_id,
                seq=seq,
                text="t",
                status=TurnState.QUEUED,
                created_at=self.clock,
                **{"deployment": self.deployment, **values},
            )
            s.add(turn)
        return turn.id

    def admit(self, limits: Limits, delivered: str | None = None) -> list[str]:
        with self.sessions() as s, s.begin():
            return admit(s, limits, self.deployment, delivered)

    def set(self, turn_id: str, **values: object) -> None:
        with self.sessions() as s, s.begin():
            turn = s.get(Turn, turn_id)
            assert turn is not None
            for name, value in values.items():
                setattr(turn, name, value)

    def owners(self, turn_ids: list[str]) -> list[str]:
        with self.sessions() as s:
            rows = s.execute(select(Turn.id, Turn.user_id).where(Turn.id.in_(turn_ids)))
            owner = {turn_id: user_id for turn_id, user_id in rows}
        return [owner[t] for t in turn_ids]


@pytest.fixture
def queue(db_sessions: sessionmaker[Session]) -> Queue:
    return Queue(db_sessions)


def test_a_user_gets_no_more_than_their_running_limit(queue: Queue, make_user: Users) -> None:
    a, _ = make_user()
    turns = [queue.turn(a) for _ in range(6)]
    assert queue.admit(Limits(per_user=2, deployment=0)) == turns[:2]  # oldest first
    assert queue.admit(Limits(per_user=2, deployment=0)) == []  # both still hold their slot
    queue.set(turns[0], status=TurnState.COMPLETED)
    assert queue.admit(Limits(per_user=2, deployment=0)) == [turns[2]]
    with queue.sessions() as s:
        assert waiting_by_user(s, queue.deployment) == {a: 3}


def test_a_parked_turn_holds_no_slot(queue: Queue, make_user: Users) -> None:
    a, _ = make_user()
    first, second = queue.turn(a), queue.turn(a)
    assert queue.admit(Limits(per_user=1, deployment=0)) == [first]
    queue.set(first, status=TurnState.PARKED)
    assert queue.admit(Limits(per_user=1, deployment=0)) == [second]
    queue.set(first, status=TurnState.RUNNING)  # woken: it runs again, over the limit for now
    third = queue.turn(a)
    assert queue.admit(Limits(per_user=1, deployment=0)) == []
    queue.set(first, status=TurnState.COMPLETED)
    queue.set(second, status=TurnState.COMPLETED)
    assert queue.admit(Limits(per_user=1, deployment=0)) == [third]


def test_slots_go_round_robin_across_users(queue: Queue, make_user: Users) -> None:
    (a, _), (b, _), (c, _) = make_user(), make_user(), make_user()
    for _ in range(10):
        queue.turn(a)  # the noisy user, first in line
    queue.turn(b)
    queue.turn(c)
    queue.turn(b)
    chosen = queue.admit(Limits(per_user=0, deployment=5))
    # One each in the order their oldest turns came, then round again: a's ten do not
    # starve b and c, and a still gets its share.
    assert queue.owners(chosen) == [a, b, c, a, b]


def test_weights_share_slots_in_proportion(queue: Queue, make_user: Users) -> None:
    (a, _), (b, _) = make_user(), make_user()
    with queue.sessions() as s, s.begin():
        s.add(UserLimits(user_id=b, weight=3))
    for _ in range(10):
        queue.turn(a)
        queue.turn(b)
    chosen = queue.admit(Limits(per_user=0, deployment=8))
    assert Counter(queue.owners(chosen)) == {a: 2, b: 6}


def test_a_users_own_limit_overrides_the_deployments(queue: Queue, make_user: Users) -> None:
    (a, _), (b, _) = make_user(), make_user()
    with queue.sessions() as s, s.begin():
        s.add(UserLimits(user_id=a, max_running_turns=5))
        s.add(UserLimits(user_id=b, max_running_turns=0))  # 0: no limit of their own
    for _ in range(8):
        queue.turn(a)
        queue.turn(b)
    chosen = queue.admit(Limits(per_user=2, deployment=0))
    assert Counter(queue.owners(chosen)) == {a: 5, b: 8}


def test_only_the_head_of_a_conversation_is_admitted(queue: Queue, make_user: Users) -> None:
    a, _ = make_user()
    conv = queue.conversation(a)
    first = queue.turn(a, conv, seq=1)
    second = queue.turn(a, conv, seq=2)
    assert queue.admit(Limits(per_user=4, deployment=0)) == [first]
    queue.set(first, status=TurnState.PARKED)  # unfinished: the second still waits behind it
    assert queue.admit(Limits(per_user=4, deployment=0)) == []
    queue.set(first, status=TurnState.CANCELLED)
    assert queue.admit(Limits(per_user=4, deployment=0)) == [second]


def test_a_cancelled_waiting_turn_is_let_through_at_once(queue: Queue, make_user: Users) -> None:
    a, _ = make_user()
    running = queue.turn(a)
    assert queue.admit(Limits(per_user=1, deployment=1)) == [running]
    cancelled = queue.turn(a, cancel_requested=True)
    assert queue.admit(Limits(per_user=1, deployment=1)) == [cancelled]  # its run only ends it


def test_a_pass_admits_only_its_own_deployments_turns(
    db_sessions: sessionmaker[Session], make_user: Users
) -> None:
    a, _ = make_user()
    ours, theirs = Queue(db_sessions), Queue(db_sessions)
    mine = ours.turn(a)
    other = theirs.turn(a)
    assert ours.admit(Limits(per_user=4, deployment=0)) == [mine]
    assert theirs.admit(Limits(per_user=4, deployment=0)) == [other]
    # A turn stored with no deployment (a scheduler tick) belongs to the queue delivering it.
    tick = ours.turn(a, deployment=None)
    assert theirs.admit(Limits(per_user=4, deployment=0)) == []
    assert theirs.admit(Limits(per_user=4, deployment=0), delivered=tick) == [tick]
    with db_sessions() as s:
        assert s.get(Turn, tick).deployment == theirs.deployment  # type: ignore[union-attr]


def test_racing_passes_never_exceed_a_limit(queue: Queue, make_user: Users) -> None:
    """Eight passes at once (gateways and orchestrators on other machines) admit each turn
    once and the user's limit exactly: the passes serialise on the admission lock."""
    users = [make_user()[0] for _ in range(4)]
    for _ in range(6):
        for user in users:
            queue.turn(user)
    results: list[list[str]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def one_pass() -> None:
        try:
            start.wait(timeout=30)
            results.append(queue.admit(Limits(per_user=3, deployment=0)))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one_pass) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    admitted = [turn for result in results for turn in result]
    assert len(admitted) == len(set(admitted)) == 12
    assert Counter(queue.owners(admitted)) == {user: 3 for user in users}


# The orchestrator's side (``Runtime.admit_waiting_turns(if_waiting=True)``): its slot freed
# (F), then ``anyone_waiting`` and a pass only if it says so (O). The gateway's side: a turn
# stored (I), then its own pass (P). Every order the two processes can take.
SKIP_ORDERS = ["FOIP", "FIOP", "FIPO", "IFOP", "IFPO", "IPFO"]


@pytest.mark.parametrize("order", SKIP_ORDERS)
def test_skipping_the_pass_when_none_waits_strands_no_turn(
    queue: Queue, make_user: Users, order: str
) -> None:
    """A turn stored while the only slot frees is admitted once, whichever order the
    orchestrator's check and the gateway's insert and pass take."""
    limits = Limits(per_user=0, deployment=1)
    user, _ = make_user()
    running = queue.turn(user)
    queue.set(running, status=TurnState.RUNNING, admitted_at=now())
    stored: list[str] = []
    admitted: list[str] = []

    def orchestrator_check() -> None:
        with standalone_connection(queue.sessions) as conn:  # as the orchestrator asks
            waiting = anyone_waiting(conn, queue.deployment)
        if waiting:
            admitted.extend(queue.admit(limits))

    steps: dict[str, Callable[[], object]] = {
        "F": lambda: queue.set(running, status=TurnState.COMPLETED),
        "O": orchestrator_check,
        "I": lambda: stored.append(queue.turn(user)),
        "P": lambda: admitted.extend(queue.admit(limits)),
    }
    for step in order:
        steps[step]()
    assert admitted == stored, f"order {order}: the stored turn was admitted exactly once"
    with queue.sessions() as s:
        assert not anyone_waiting(s, queue.deployment)


def test_racing_checks_and_inserts_leave_no_turn_waiting_for_a_free_slot(
    queue: Queue, make_user: Users
) -> None:
    """Threads this time: orchestrators freeing slots and checking, gateways storing turns
    and passing, all at once; afterwards no turn waits while a slot is free."""
    limits = Limits(per_user=0, deployment=4)
    users = [make_user()[0] for _ in range(4)]
    running = [queue.turn(u) for u in users]
    for turn_id in running:
        queue.set(turn_id, status=TurnState.RUNNING, admitted_at=now())
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def orchestrator(turn_id: str) -> None:
        try:
            start.wait(timeout=30)
            queue.set(turn_id, status=TurnState.COMPLETED)
            with standalone_connection(queue.sessions) as conn:  # as the orchestrator asks
                waiting = anyone_waiting(conn, queue.deployment)
            if waiting:
                queue.admit(limits)
        except BaseException as exc:
            errors.append(exc)

    def gateway(user_id: str) -> None:
        try:
            start.wait(timeout=30)
            queue.turn(user_id)
            queue.admit(limits)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=orchestrator, args=(t,)) for t in running]
    threads += [threading.Thread(target=gateway, args=(u,)) for u in users]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    with queue.sessions() as s:
        assert not anyone_waiting(s, queue.deployment)  # 4 new turns, 4 free slots
