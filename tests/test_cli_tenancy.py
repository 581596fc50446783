"""``signalbox users create --admin``, ``users set-admin``, ``users set-budget`` and the
budgets ``signalbox usage`` shows, on a real (SQLite) database."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from signalbox.cli import main
from signalbox.shared.db import ModelRequest, User, UserLimits, make_engine, make_session_factory
from signalbox.shared.db.migrate import upgrade


def test_admin_role_and_budgets_from_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'tenancy.db'}"
    upgrade(url)
    monkeypatch.setenv("SIGNALBOX_DATABASE_URL", url)
    sessions = make_session_factory(make_engine(url))

    assert main(["users", "create", "root", "--admin"]) == 0
    assert main(["users", "add", "alice"]) == 0
    capsys.readouterr()
    assert main(["users", "list"]) == 0
    listed = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert listed["root"].endswith("admin") and not listed["alice"].endswith("admin")

    assert main(["users", "set-admin", "alice"]) == 0
    assert main(["users", "set-admin", "root", "--off"]) == 0
    with sessions() as s:
        roles = {name: flag for name, flag in s.execute(select(User.name, User.is_admin))}
    assert roles == {"root": False, "alice": True}

    assert main(["users", "set-budget", "alice", "--day", "1000", "--month", "none"]) == 0
    with sessions() as s:
        alice = s.scalars(select(User).where(User.name == "alice")).one()
        limits = s.get(UserLimits, alice.id)
        assert limits is not None and (limits.day_tokens, limits.month_tokens) == (1000, None)
    with sessions() as s, s.begin():
        s.add(
            ModelRequest(
                user_id=alice.id,
                conversation_id="conv_x",
                turn_id="turn_x",
                root_turn_id="turn_x",
                purpose="step",
                model="m",
                input_tokens=700,
                output_tokens=400,
            )
        )
    capsys.readouterr()
    assert main(["usage", "--user", "alice"]) == 0
    out = capsys.readouterr().out
    assert "budget alice: 1100 / 1000 tokens this day" in out and "EXCEEDED" in out

    assert main(["users", "set-budget", "nobody", "--day", "1"]) == 1
    assert "no user named 'nobody'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["users", "set-budget", "alice", "--day", "lots"])


def test_a_users_fair_share_from_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'share.db'}"
    upgrade(url)
    monkeypatch.setenv("SIGNALBOX_DATABASE_URL", url)
    sessions = make_session_factory(make_engine(url))
    assert main(["users", "add", "bob"]) == 0
    capsys.readouterr()

    assert main(["users", "set-share", "bob", "--running-turns", "2", "--weight", "3"]) == 0
    assert "share of 'bob': running turns 2, weight 3" in capsys.readouterr().out
    with sessions() as s:
        bob = s.scalars(select(User).where(User.name == "bob")).one()
        limits = s.get(UserLimits, bob.id)
        assert limits is not None and (limits.max_running_turns, limits.weight) == (2, 3)

    assert main(["users", "set-share", "bob", "--running-turns", "none"]) == 0
    with sessions() as s:
        limits = s.get(UserLimits, bob.id)
        assert limits is not None and (limits.max_running_turns, limits.weight) == (None, None)
    assert main(["users", "set-share", "bob", "--weight", "0"]) == 1
    assert "expected a weight of 1 or more" in capsys.readouterr().err
