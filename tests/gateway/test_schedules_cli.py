"""``signalbox schedules`` and ``signalbox alarms`` through ``main()`` against a real gateway
(the SDK over real HTTP): create, list, pause, resume, runs, delete, list and cancel alarms;
a bad cron and an unknown id exit 1 with the reason on stderr."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.orm import Session, sessionmaker

from signalbox.cli import main
from signalbox.shared.db import Alarm
from signalbox.shared.ids import new_id

from .conftest import LiveGateway


def test_schedules_and_alarms_cli_round_trip_and_refusals_exit_1(
    gateway: LiveGateway,
    make_user: Callable[[], tuple[str, str]],
    conversation_of: Callable[[str], str],
    db_sessions: sessionmaker[Session],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    user_id, token = make_user()
    monkeypatch.setenv("SIGNALBOX_TOKEN", token)

    def cli(*args: str) -> tuple[int, str, str]:
        code = main([*args, "--url", gateway.url])
        out, err = capsys.readouterr()
        return code, out, err

    code, out, _ = cli("schedules", "list")
    assert code == 0 and out.startswith("no schedules")

    code, out, err = cli(
        "schedules", "create", "--cron", "0 9 * * 1-5", "--timezone", "Europe/Paris",
        "--hours", "8-18", "Summarise the inbox",
    )  # fmt: skip
    assert code == 0, err
    schedule_id = out.split()[0]
    assert schedule_id.startswith("sched_")
    assert "active  cron '0 9 * * 1-5' Europe/Paris 8-18h" in out and "last: never" in out

    code, out, _ = cli("schedules", "pause", schedule_id)
    assert code == 0 and f"{schedule_id}  paused" in out
    code, out, _ = cli("schedules", "resume", schedule_id)
    assert code == 0 and f"{schedule_id}  active" in out
    code, out, _ = cli("schedules", "list")
    assert code == 0 and out.startswith(schedule_id)
    code, out, _ = cli("schedules", "runs", schedule_id)
    assert code == 0 and out.strip() == "no runs yet"

    code, _, err = cli("schedules", "create", "--cron", "every day", "x")
    assert code == 1 and "cron" in err
    code, _, err = cli("schedules", "create", "--every", "60", "--timezone", "Nowhere/Zone", "x")
    assert code == 1 and "time zone" in err

    code, out, _ = cli("schedules", "delete", schedule_id)
    assert code == 0 and out.strip() == f"deleted {schedule_id}"
    code, _, err = cli("schedules", "pause", schedule_id)
    assert code == 1 and "not found" in err

    code, out, _ = cli("alarms", "list")
    assert code == 0 and out.startswith("no alarms")
    alarm_id = new_id("alarm")
    with db_sessions() as session:  # as the alarm tool stores it
        session.add(
            Alarm(
                id=alarm_id,
                user_id=user_id,
                conversation_id=conversation_of(user_id),
                wake_at=datetime.now(UTC) + timedelta(hours=2),
                note="check the build",
            )
        )
        session.commit()
    code, out, _ = cli("alarms", "list")
    assert code == 0 and out.startswith(f"{alarm_id}  pending") and "check the build" in out
    code, out, _ = cli("alarms", "cancel", alarm_id)
    assert code == 0 and out.startswith(f"{alarm_id}  cancelled")
    code, _, err = cli("alarms", "cancel", "alarm_nobody")
    assert code == 1 and "not found" in err
