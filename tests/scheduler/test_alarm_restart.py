"""An alarm an agent sets for +2 s survives the death of every service: the demo model calls
the ``alarm`` tool in a real turn, every process of the stack is killed before the alarm
rings and the beat's Redis store is wiped, and once they start again the alarm's turn runs
in the same conversation exactly once, its ``turn_queued`` naming the alarm."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from signalbox.shared.db import Alarm, Turn
from signalbox.shared.event_stream import EventStream
from signalbox.shared.redis_keys import RedisKeys
from signalbox.stack import Stack, StackConfig
from tests import http_calls
from tests.scheduler.polling import wait_for

# After the alarm's turn, how long nothing more may start: several beat periods.
QUIET_S = 4.0


@pytest.fixture
def own_stack(
    tmp_path: Path, redis_url: str, redis_prefix: str, stack_database_url: str, internal_token: str
) -> Iterator[Stack]:
    """A stack of this test's own (it is killed and restarted; the shared one is not)."""
    config = StackConfig(
        var_dir=tmp_path,
        redis_url=redis_url,
        database_url=stack_database_url,
        internal_token=internal_token,
        redis_prefix=redis_prefix + "alarm-stack:",
        extra_env={"ANTHROPIC_API_KEY": ""},
    )
    stack = Stack(config)
    stack.start()
    yield stack
    stack.stop()


def test_an_alarm_for_two_seconds_rings_once_after_every_service_is_killed_and_restarted(
    own_stack: Stack,
    make_stack_user: Callable[[], tuple[str, str]],
    stack_sessions: sessionmaker[Session],
    redis_client: redis.Redis,
) -> None:
    stack = own_stack
    user_id, token = make_stack_user()
    auth = {"Authorization": f"Bearer {token}"}
    conversation_id = http_calls.post(
        f"{stack.gateway_url}/api/conversations", json={}, headers=auth
    ).json()["conversation_id"]
    sent = http_calls.post(
        f"{stack.gateway_url}/api/conversations/{conversation_id}/turns",
        json={"text": "wake me in 2 seconds to check the build", "client_turn_id": "c1"},
        headers=auth,
    )
    assert sent.status_code == 202, sent.text

    def alarm() -> Alarm | None:
        with stack_sessions() as session:
            return session.scalars(
                select(Alarm).where(Alarm.conversation_id == conversation_id)
            ).first()

    wait_for(lambda: alarm() is not None, 30, "the alarm tool to store the alarm")
    for child in list(stack.children.values()):  # a crash of everything, not a warm stop
        child.signal_group(signal.SIGKILL)
    stack.stop()
    stored = alarm()
    assert stored is not None and stored.status == "pending", "it rang before the crash"
    assert stored.user_id == user_id and stored.note == "check the build"
    # Redis keeps nothing on disk in a deployment: the beat store is rebuilt from SQL.
    for key in redis_client.scan_iter(f"{stack.config.redis_prefix}redbeat:*"):
        redis_client.delete(key)
    wait_for(lambda: time.time() > stored.wake_at.timestamp(), 5, "the alarm time to pass")

    stack.start()

    def alarm_turns() -> list[Turn]:
        with stack_sessions() as session:
            return list(
                session.scalars(select(Turn).where(Turn.client_turn_id == f"alarm:{stored.id}"))
            )

    wait_for(lambda: any(t.status == "completed" for t in alarm_turns()), 60, "the alarm's turn")
    time.sleep(QUIET_S)  # what is asserted is that nothing more starts meanwhile
    [turn] = alarm_turns()
    assert turn.conversation_id == conversation_id and turn.text == "[alarm] check the build"
    fired = alarm()
    assert fired is not None and fired.status == "fired" and fired.turn_id == turn.id
    with stack_sessions() as session:
        turns = session.scalar(select(func.count()).where(Turn.conversation_id == conversation_id))
    assert turns == 2  # the one that set the alarm, and the one it woke

    events = EventStream(redis_client, RedisKeys(stack.config.redis_prefix))
    queued = [e.data for e in events.read_after(conversation_id, None) if e.kind == "turn_queued"]
    assert [q["client_turn_id"] for q in queued] == ["c1", f"alarm:{stored.id}"]
