"""current_time: what time it is, in UTC or in a named IANA time zone (the model has no clock)."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, Field

from signalbox.services.tools.registry import Registry, ToolContext, ToolError

registry = Registry()


class CurrentTimeInput(BaseModel):
    """Input of ``current_time``."""

    timezone: str | None = Field(
        None, max_length=64, description="an IANA time zone such as 'Europe/Paris'; default UTC"
    )


def rfc3339(moment: datetime) -> str:
    """``moment`` as RFC 3339 to the second, ``Z`` for UTC."""
    text = moment.isoformat(timespec="seconds")
    return text.replace("+00:00", "Z") if moment.tzinfo is UTC else text


@registry.tool(
    name="current_time",
    description=(
        "The current date and time as RFC 3339 (UTC, or in the given IANA time zone such as "
        "'America/New_York'), with the weekday."
    ),
    timeout_s=5,
    side_effect="read",
    idempotent=True,
    quick=True,
)
def current_time(args: CurrentTimeInput, ctx: ToolContext) -> str:
    """Now, in UTC or ``args.timezone``."""
    now = datetime.now(UTC)
    if args.timezone is None:
        return f"{rfc3339(now)} ({now:%A}, UTC)"
    try:
        zone = ZoneInfo(args.timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ToolError(
            f"unknown time zone {args.timezone!r}; use an IANA name such as 'Europe/Paris'"
        ) from None
    local = now.astimezone(zone)
    return f"{rfc3339(local)} ({local:%A}, {args.timezone}; UTC {rfc3339(now)})"
