"""``signalbox usage``: what the model cost, per user (or conversation, turn, model, purpose).

An operator's command, like ``signalbox users``: it reads ``SIGNALBOX_DATABASE_URL``
directly (every user's requests), where ``GET /api/usage`` shows a user only their own.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import select

from signalbox.admin import AdminError, session_for
from signalbox.shared.db import User, UserLimits
from signalbox.shared.db.budgets import budget_states
from signalbox.shared.db.usage import GroupBy, UsageSum, summarize
from signalbox.shared.timestamps import rfc3339

HEADER = ("requests", "input", "cache write", "cache read", "output", "cost USD")


def _row(label: str, s: UsageSum) -> tuple[str, ...]:
    cost = f"{s.cost_usd:.4f}"
    if s.unpriced_requests:
        cost += f" (+{s.unpriced_requests} unpriced)"
    return (
        label,
        str(s.requests),
        str(s.input_tokens),
        str(s.cache_creation_input_tokens),
        str(s.cache_read_input_tokens),
        str(s.output_tokens),
        cost,
    )


def usage_table(
    database_url: str,
    group_by: GroupBy = "user",
    user_name: str | None = None,
    since: datetime | None = None,
) -> list[tuple[str, ...]]:
    """The rows ``signalbox usage`` prints: a header, one per group, then the total."""
    with session_for(database_url) as session:
        user_id = None
        if user_name is not None:
            user_id = session.scalar(select(User.id).where(User.name == user_name))
            if user_id is None:
                raise AdminError(f"no user named {user_name!r}")
        names = {uid: name for uid, name in session.execute(select(User.id, User.name))}
        groups = summarize(session, user_id=user_id, since=since, group_by=group_by)
        [total] = summarize(session, user_id=user_id, since=since)
    rows: list[tuple[str, ...]] = [(group_by, *HEADER)]
    for g in groups:
        label = names.get(g.key or "", g.key or "") if group_by == "user" else g.key or ""
        rows.append(_row(label, g))
    rows.append(_row("total", total))
    return rows


def budget_lines(
    database_url: str, user_name: str | None = None, now: datetime | None = None
) -> list[str]:
    """One line per budget set (of ``user_name``, else of every user): used / limit."""
    moment = now or datetime.now(UTC)
    with session_for(database_url) as session:
        query = select(User.id, User.name).join(UserLimits, UserLimits.user_id == User.id)
        if user_name is not None:
            query = query.where(User.name == user_name)
        lines = []
        for user_id, name in session.execute(query.order_by(User.name)).all():
            for state in budget_states(session, user_id, moment):
                over = "  EXCEEDED" if state.exceeded else ""
                lines.append(
                    f"budget {name}: {state.used_tokens} / {state.limit_tokens} tokens this "
                    f"{state.period}, resets {rfc3339(state.resets_at)}{over}"
                )
    return lines


def run_usage(
    database_url: str,
    group_by: GroupBy = "user",
    user_name: str | None = None,
    since: datetime | None = None,
) -> int:
    """Print the usage table; 0."""
    rows = usage_table(database_url, group_by, user_name, since)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        numbers = [c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)]
        cells = [r[0].ljust(widths[0]), *numbers]
        print("  ".join(cells).rstrip())
    for line in budget_lines(database_url, user_name):
        print(line)
    return 0
