"""The ``signalbox`` command as an operator runs it: a real process on a real database."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select

from signalbox.admin import revoke_user_tokens, session_for
from signalbox.cli import main
from signalbox.processes import Child
from signalbox.redis_server import RedisServer
from signalbox.shared.db import User, make_engine, make_session_factory
from signalbox.shared.db.migrate import upgrade
from signalbox.shared.db.users import user_for_token
from signalbox.stack import Stack, StackConfig
from signalbox.up import (
    ADMIN_USER,
    Supervisor,
    ensure_admin_token,
    prepare_var,
    read_or_create_secret,
)

CLI_TIMEOUT_S = 60


def signalbox(
    *args: str, database_url: str, extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the installed ``signalbox`` script (``python -m signalbox.cli`` if not installed)."""
    script = Path(sys.executable).with_name("signalbox")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "signalbox.cli"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIGNALBOX_")}
    env["SIGNALBOX_DATABASE_URL"] = database_url
    env.update(extra or {})
    return subprocess.run(
        [*command, *args], env=env, capture_output=True, text=True, timeout=CLI_TIMEOUT_S
    )


def token_works(database_url: str, token: str) -> bool:
    engine = make_engine(database_url)
    try:
        with make_session_factory(engine)() as session:
            return user_for_token(session, token) is not None
    finally:
        engine.dispose()


@pytest.fixture
def fresh_db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def run_in_process(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    database_url: str,
    *args: str,
) -> tuple[int, str, str]:
    """``signalbox args`` through ``main()`` in this process (faster; same code path)."""
    monkeypatch.setenv("SIGNALBOX_DATABASE_URL", database_url)
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_users_add_then_revoke(
    fresh_db: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    migrated = signalbox("migrate", database_url=fresh_db)
    assert migrated.returncode == 0, migrated.stderr

    added = signalbox("users", "add", "alice", database_url=fresh_db)
    assert added.returncode == 0, added.stderr
    token = added.stdout.strip()
    assert token_works(fresh_db, token)

    code, listed, _ = run_in_process(monkeypatch, capsys, fresh_db, "users", "list")
    assert code == 0 and "alice" in listed and "live tokens 1" in listed

    revoked = signalbox("users", "revoke", "alice", database_url=fresh_db)
    assert revoked.returncode == 0, revoked.stderr
    assert not token_works(fresh_db, token)

    code, again, _ = run_in_process(monkeypatch, capsys, fresh_db, "users", "token", "alice")
    assert code == 0 and token_works(fresh_db, again.strip())


def test_errors_name_the_problem(
    fresh_db: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_in_process(monkeypatch, capsys, fresh_db, "users", "add", "bob")
    assert code == 1 and "signalbox migrate" in err

    upgrade(fresh_db)
    assert run_in_process(monkeypatch, capsys, fresh_db, "users", "add", "bob")[0] == 0
    code, _, err = run_in_process(monkeypatch, capsys, fresh_db, "users", "add", "bob")
    assert code == 1 and "'bob' already exists" in err
    code, _, err = run_in_process(monkeypatch, capsys, fresh_db, "users", "revoke", "nobody")
    assert code == 1 and "'nobody'" in err


def test_up_refuses_an_unreachable_redis(tmp_path: Path) -> None:
    result = signalbox(
        "up",
        "--var",
        str(tmp_path / "var"),
        database_url=f"sqlite:///{tmp_path / 'var' / 'signalbox.db'}",
        extra={"SIGNALBOX_REDIS_URL": "redis://127.0.0.1:1/0"},
    )
    assert result.returncode == 1
    assert "nothing answers PING" in result.stderr
    assert "redis://127.0.0.1:1/0" in result.stderr


def test_secrets_are_private_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "var" / "internal-token"
    first = read_or_create_secret(path, lambda: "s" * 32)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_or_create_secret(path, lambda: "other") == first


def test_admin_token_survives_restarts_and_revocation(fresh_db: str, tmp_path: Path) -> None:
    upgrade(fresh_db)
    token_file = tmp_path / "admin-token"
    first = ensure_admin_token(fresh_db, token_file)
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert ensure_admin_token(fresh_db, token_file) == first  # a restart prints the same token

    revoke_user_tokens(fresh_db, ADMIN_USER)
    second = ensure_admin_token(fresh_db, token_file)
    assert second != first and token_works(fresh_db, second)
    assert token_file.read_text().strip() == second
    with session_for(fresh_db) as session:  # the operator of `signalbox up` is an admin
        admin = session.scalars(select(User).where(User.name == ADMIN_USER)).one()
        assert admin.is_admin


def test_supervisor_reports_a_dead_child(tmp_path: Path) -> None:
    stack = Stack(StackConfig(var_dir=tmp_path, redis_url="", database_url="", internal_token=""))
    child = Child(
        name="orchestrator1",
        args=[sys.executable, "-c", "import sys; print('boom: bad settings'); sys.exit(3)"],
        log_path=tmp_path / "logs" / "orchestrator1.log",
        env=dict(os.environ),
    )
    stack.children[child.name] = child
    out = io.StringIO()
    supervisor = Supervisor(stack, RedisServer(url="redis://unused"), out)
    child.start()
    assert supervisor.run() == 1
    report = out.getvalue()
    assert "orchestrator1 exited with status 3" in report
    assert "boom: bad settings" in report


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_up_keeps_its_state_private(tmp_path: Path) -> None:
    """A real `signalbox up` (stopped at Redis, after preparing var/): nothing for others."""
    var = tmp_path / "var"
    result = signalbox(
        "up",
        "--var",
        str(var),
        database_url=f"sqlite:///{var / 'signalbox.db'}",
        extra={"SIGNALBOX_REDIS_URL": "redis://127.0.0.1:1/0"},
    )
    assert result.returncode == 1 and "nothing answers PING" in result.stderr
    for directory in (var, var / "logs", var / "workspaces", var / "redis"):
        assert _mode(directory) == 0o700, directory
    for name in ("signalbox.db", "internal-token", "admin-token"):
        assert _mode(var / name) == 0o600, name


def test_prepare_var_narrows_what_an_older_version_left_open(tmp_path: Path) -> None:
    var = tmp_path / "var"
    old_files = ("signalbox.db", "signalbox.db-wal", "signalbox.db-shm", "admin-token")
    for directory in (var, var / "logs", var / "workspaces" / "user_1"):
        directory.mkdir(parents=True, mode=0o755)
        directory.chmod(0o755)
    for name in (*old_files, "logs/gateway.log"):
        (var / name).write_text("x")
        (var / name).chmod(0o644)
    elsewhere = tmp_path / "elsewhere.db"  # SIGNALBOX_DATABASE_URL outside var/
    elsewhere.write_text("x")
    elsewhere.chmod(0o664)
    outside = tmp_path / "not-ours"
    outside.write_text("x")
    outside.chmod(0o644)
    (var / "link").symlink_to(outside)

    prepare_var(var, f"sqlite:///{var / 'signalbox.db'}")
    prepare_var(var, f"sqlite:///{elsewhere}")

    for directory in (var, var / "logs", var / "workspaces", var / "redis"):
        assert _mode(directory) == 0o700, directory
    for name in (*old_files, "logs/gateway.log"):
        assert _mode(var / name) == 0o600, name
    assert _mode(elsewhere) == 0o600
    assert _mode(outside) == 0o644  # a symlink's target is left alone


def test_migrate_creates_the_sqlite_file_private(tmp_path: Path) -> None:
    database = tmp_path / "new" / "signalbox.db"
    upgrade(f"sqlite:///{database}")
    assert _mode(database) == 0o600
    assert all(
        _mode(p) == 0o600 for p in database.parent.iterdir() if p.name.startswith(database.name)
    )
