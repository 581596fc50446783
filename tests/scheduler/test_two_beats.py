"""Two scheduler processes (each a worker with an embedded RedBeat beat) on one schedule:
every one-second tick starts exactly one turn, and a paused schedule starts none."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from signalbox.shared.db import Schedule, ScheduleRun, Turn
from signalbox.shared.ids import new_id
from tests.scheduler.polling import wait_for

RUN_S = 60


def _start(env: dict[str, str], name: str, log_dir: str) -> subprocess.Popen[bytes]:
    log = open(os.path.join(log_dir, f"{name}.log"), "wb")  # noqa: SIM115 - lives with the child
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "signalbox.services.scheduler.worker:app", "worker",
         "-B", "-Q", "scheduler", "--pool", "threads", "-c", "2", "-n", f"{name}@%h",
         "--without-gossip", "--without-mingle", "--loglevel", "INFO"],
        env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip


@pytest.fixture
def two_schedulers(service_env: dict[str, str], tmp_path: object) -> Iterator[None]:
    children = [_start(service_env, f"sched{i}", str(tmp_path)) for i in (1, 2)]
    yield
    for child in children:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()


@pytest.mark.timeout(RUN_S + 120)  # start-up, the first tick, RUN_S of ticks, the pause
def test_a_one_second_schedule_under_two_beats_runs_each_tick_once(
    db_sessions: sessionmaker[Session],
    make_user: Callable[[], tuple[str, str]],
    two_schedulers: None,
) -> None:
    user_id, _ = make_user()
    schedule_id = new_id("sched")
    with db_sessions() as session:
        session.add(
            Schedule(
                id=schedule_id,
                user_id=user_id,
                kind="interval",
                interval_s=1,
                timezone="UTC",
                prompt="tick",
                catch_up=True,
                paused=False,
                created_at=datetime.now(UTC),
                workspace="default",
            )
        )
        session.commit()

    def counts() -> tuple[int, int, int]:
        """Runs, distinct tick times and turns, in ONE statement: one snapshot, so a tick
        committed while they are read cannot show as a turn without its run."""
        runs = select(func.count()).where(ScheduleRun.schedule_id == schedule_id)
        ticks = select(func.count(func.distinct(ScheduleRun.tick_at))).where(
            ScheduleRun.schedule_id == schedule_id
        )
        turns = select(func.count()).where(Turn.client_turn_id.like(f"schedule:{schedule_id}:%"))
        with db_sessions() as session:
            row = session.execute(
                select(runs.scalar_subquery(), ticks.scalar_subquery(), turns.scalar_subquery())
            ).one()
        return row[0] or 0, row[1] or 0, row[2] or 0

    # The beats sync SQL at start-up: the schedule is picked up without any message.
    wait_for(lambda: counts()[0] >= 1, 60, "the scheduler")
    started = time.monotonic()
    wait_for(lambda: time.monotonic() - started > RUN_S, RUN_S + 5, "the scheduler")
    runs, ticks, turns = counts()
    assert runs == ticks == turns  # one run and one turn per tick time
    assert RUN_S * 0.6 <= runs <= RUN_S + 3  # about one a second, never two beats' worth

    with db_sessions() as session:
        row = session.get(Schedule, schedule_id)
        assert row is not None
        row.paused = True
        session.commit()
    from signalbox.services.scheduler.tasks import sync_schedule

    sync_schedule.delay(schedule_id).get(timeout=20)
    paused_at = counts()[0]
    time.sleep(3)  # the absence of ticks over three beat periods is what is asserted
    assert counts()[0] <= paused_at + 1
