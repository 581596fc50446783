"""``/api/schedules`` and ``/api/alarms`` over the real gateway: the owner's life cycle of a
schedule, the shapes answered, bad input refused with 422, and another user's ids unseen."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import redis
from sqlalchemy.orm import Session, sessionmaker

from signalbox.shared.celery_app import SCHEDULER_QUEUE
from signalbox.shared.db import Alarm, ScheduleRun
from signalbox.shared.ids import new_id
from tests import http_calls

from .conftest import LiveGateway, bearer, queued_messages

SCHEDULE_FIELDS = {
    "id", "name", "kind", "interval_s", "at", "cron", "timezone", "active_from_hour",
    "active_until_hour", "prompt", "conversation_id", "workspace", "agent", "catch_up",
    "paused", "created_at", "last_tick_at",
}  # fmt: skip


def _create(gw: LiveGateway, token: str, **body: Any) -> httpx.Response:
    return http_calls.post(f"{gw.url}/api/schedules", json=body, headers=bearer(token))


def test_the_scheduler_is_told_with_no_celery_result_kept(
    gateway: LiveGateway, make_user: Callable[[], tuple[str, str]], redis_client: redis.Redis
) -> None:
    # The gateway has no result backend; a kept result would be written for no reader.
    _user_id, token = make_user()
    created = _create(gateway, token, kind="interval", interval_s=3600, prompt="Tidy up")
    assert created.status_code == 201, created.text
    sent = queued_messages(redis_client, gateway.keys, SCHEDULER_QUEUE)
    [message] = [m for m in sent if created.json()["id"] in m["headers"]["argsrepr"]]
    assert message["headers"]["ignore_result"] is True


def test_an_owner_creates_lists_pauses_resumes_and_deletes_a_schedule(
    gateway: LiveGateway,
    make_user: Callable[[], tuple[str, str]],
    db_sessions: sessionmaker[Session],
) -> None:
    _user_id, token = make_user()
    created = _create(
        gateway, token, kind="cron", cron="*/5 * * * *", timezone="Europe/Paris",
        active_from_hour=9, active_until_hour=17, prompt="Summarise the inbox", name="inbox",
    )  # fmt: skip
    assert created.status_code == 201, created.text
    schedule = created.json()
    assert set(schedule) == SCHEDULE_FIELDS
    assert schedule["kind"] == "cron" and schedule["timezone"] == "Europe/Paris"
    assert schedule["paused"] is False and schedule["last_tick_at"] is None
    assert schedule["workspace"] == "default" and schedule["conversation_id"] is None

    listed = http_calls.get(f"{gateway.url}/api/schedules", headers=bearer(token)).json()
    assert [s["id"] for s in listed] == [schedule["id"]]

    path = f"{gateway.url}/api/schedules/{schedule['id']}"
    paused = http_calls.patch(path, json={"paused": True}, headers=bearer(token))
    assert paused.status_code == 200 and paused.json()["paused"] is True
    resumed = http_calls.patch(path, json={"paused": False}, headers=bearer(token))
    assert resumed.json()["paused"] is False

    tick_at = datetime(2030, 1, 1, 9, 0, tzinfo=UTC)
    with db_sessions() as session:  # a tick as the scheduler records it
        session.add(
            ScheduleRun(
                id=new_id("srun"), schedule_id=schedule["id"], tick_at=tick_at, status="skipped"
            )
        )
        session.commit()
    runs = http_calls.get(f"{path}/runs", headers=bearer(token)).json()
    assert runs == [
        {
            "tick_at": "2030-01-01T09:00:00Z",
            "status": "skipped",
            "conversation_id": None,
            "turn_id": None,
            "error": None,
            "created_at": runs[0]["created_at"],
        }
    ]

    assert http_calls.delete(path, headers=bearer(token)).status_code == 204
    assert http_calls.get(f"{gateway.url}/api/schedules", headers=bearer(token)).json() == []
    assert http_calls.get(f"{path}/runs", headers=bearer(token)).status_code == 404


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"kind": "cron", "cron": "every tuesday", "prompt": "x"}, "cron"),
        ({"kind": "cron", "cron": "61 * * * *", "prompt": "x"}, "cron"),
        ({"kind": "interval", "interval_s": 60, "timezone": "Mars/Olympus", "prompt": "x"}, "zone"),
        ({"kind": "interval", "interval_s": 0, "prompt": "x"}, "interval_s"),
        ({"kind": "interval", "prompt": "x"}, "interval_s"),
        ({"kind": "at", "at": "2030-01-01T09:00:00", "prompt": "x"}, "offset"),
        ({"kind": "interval", "interval_s": 60, "active_from_hour": 9, "prompt": "x"}, "active"),
        ({"kind": "weekly", "prompt": "x"}, "kind"),
        ({"kind": "interval", "interval_s": 60, "prompt": "x", "agent": "nobody-has-it"}, "agent"),
    ],
)
def test_a_bad_schedule_is_refused_with_422_naming_what_is_wrong(
    gateway: LiveGateway, make_user: Callable[[], tuple[str, str]], body: Any, says: str
) -> None:
    _user_id, token = make_user()
    answer = _create(gateway, token, **body)
    assert answer.status_code in (404, 422), answer.text  # an unknown agent: not found
    assert says in answer.text
    assert http_calls.get(f"{gateway.url}/api/schedules", headers=bearer(token)).json() == []


def test_another_users_schedule_and_alarm_are_not_found(
    gateway: LiveGateway,
    make_user: Callable[[], tuple[str, str]],
    conversation_of: Callable[[str], str],
    db_sessions: sessionmaker[Session],
) -> None:
    owner_id, owner_token = make_user()
    _intruder_id, intruder_token = make_user()
    schedule = _create(gateway, owner_token, kind="interval", interval_s=3600, prompt="x").json()
    alarm_id = new_id("alarm")
    with db_sessions() as session:  # an alarm as the alarm tool stores it
        session.add(
            Alarm(
                id=alarm_id,
                user_id=owner_id,
                conversation_id=conversation_of(owner_id),
                wake_at=datetime.now(UTC) + timedelta(hours=1),
                note="check the build",
            )
        )
        session.commit()
    path = f"{gateway.url}/api/schedules/{schedule['id']}"
    intruder = bearer(intruder_token)

    assert http_calls.patch(path, json={"paused": True}, headers=intruder).status_code == 404
    assert http_calls.delete(path, headers=intruder).status_code == 404
    assert http_calls.get(f"{path}/runs", headers=intruder).status_code == 404
    assert http_calls.get(f"{gateway.url}/api/schedules", headers=intruder).json() == []
    assert (
        http_calls.delete(f"{gateway.url}/api/alarms/{alarm_id}", headers=intruder).status_code
        == 404
    )
    assert http_calls.get(f"{gateway.url}/api/alarms", headers=intruder).json() == []
    # A conversation that is not mine cannot be a schedule's target either.
    foreign = _create(
        gateway, intruder_token, kind="interval", interval_s=60, prompt="x",
        conversation_id=schedule["id"],
    )  # fmt: skip
    assert foreign.status_code == 404

    owner = bearer(owner_token)
    assert http_calls.get(path + "/runs", headers=owner).json() == []
    [alarm] = http_calls.get(f"{gateway.url}/api/alarms", headers=owner).json()
    assert alarm["id"] == alarm_id and alarm["status"] == "pending"
    assert set(alarm) == {
        "id", "conversation_id", "wake_at", "note", "status", "turn_id", "created_at", "fired_at",
    }  # fmt: skip
    cancelled = http_calls.delete(f"{gateway.url}/api/alarms/{alarm_id}", headers=owner)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert http_calls.patch(path, json={"paused": True}, headers=owner).json()["paused"] is True
