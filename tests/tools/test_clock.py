"""current_time: RFC 3339 now, in UTC or a named IANA zone; a bad zone is an error."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.tools.conftest import ToolEnv


def _parse(output: str) -> datetime:
    return datetime.fromisoformat(output.split(" ", 1)[0].replace("Z", "+00:00"))


def test_utc_by_default(tool_env: ToolEnv) -> None:
    result = tool_env.run("current_time")
    assert result.status == "ok", result.error
    stamp = result.output.split(" ", 1)[0]
    assert stamp.endswith("Z") and result.output.endswith(", UTC)")
    assert abs(_parse(result.output) - datetime.now(UTC)) < timedelta(seconds=5)


def test_an_iana_zone_gives_local_time_with_its_offset(tool_env: ToolEnv) -> None:
    result = tool_env.run("current_time", timezone="Asia/Kolkata")
    assert result.status == "ok", result.error
    local = _parse(result.output)
    assert local.utcoffset() == timedelta(hours=5, minutes=30)
    assert abs(local - datetime.now(UTC)) < timedelta(seconds=5)
    assert "Asia/Kolkata" in result.output


def test_an_unknown_or_hostile_zone_is_an_error(tool_env: ToolEnv) -> None:
    for zone in ("Mars/Olympus", "../../etc/passwd", "/etc/localtime"):
        result = tool_env.run("current_time", timezone=zone)
        assert result.status == "error" and "unknown time zone" in (result.error or ""), zone
