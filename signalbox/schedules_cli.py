"""``signalbox schedules list|create|pause|resume|delete|runs`` and ``signalbox alarms
list|cancel``: my scheduled and self-waking turns, through the SDK's ``Client``.

Exit status 0 when the request did what was asked, 1 when the schedule or alarm is not
found or the gateway refused (a bad cron or time zone: the message on stderr says which).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import datetime
from typing import TextIO

from pydantic import ValidationError

from signalbox.client import Client, SignalboxError
from signalbox.shared.schedules_api import AlarmOut, ScheduleIn, ScheduleOut, SchedulePatch
from signalbox.shared.timestamps import rfc3339, rfc3339_or_none


def add_arguments(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    client_options: Callable[[argparse.ArgumentParser], None],
) -> None:
    """The ``schedules`` and ``alarms`` subcommands (``client_options``: ``--url``/``--token``)."""
    schedules = sub.add_parser("schedules", help="list, create, pause, resume or delete schedules")
    actions = schedules.add_subparsers(dest="schedules_command", required=True, metavar="ACTION")
    client_options(actions.add_parser("list", help="my schedules"))
    create = actions.add_parser("create", help="run a prompt every N s, at a time, or by cron")
    when = create.add_mutually_exclusive_group(required=True)
    when.add_argument("--every", type=int, metavar="SECONDS", help="an interval schedule")
    when.add_argument("--at", type=datetime.fromisoformat, help="once, at this RFC 3339 time")
    when.add_argument("--cron", help='a five-field cron expression, e.g. "0 9 * * 1-5"')
    create.add_argument("prompt", help="the text of each run's turn")
    create.add_argument("--name", default="")
    create.add_argument("--timezone", default="UTC", help="IANA time zone of --cron and hours")
    create.add_argument("--hours", help="active hours in the time zone, e.g. 9-17")
    create.add_argument("--conversation", help="run in this conversation (default: a new one)")
    create.add_argument("--agent", help="the agent of each new conversation")
    create.add_argument(
        "--skip-missed", action="store_true", help="skip ticks missed while down (default: run)"
    )
    client_options(create)
    for action, what in (
        ("pause", "stop a schedule's runs until resumed"),
        ("resume", "let a paused schedule run again"),
        ("delete", "delete a schedule and its runs"),
        ("runs", "a schedule's last runs"),
    ):
        one = actions.add_parser(action, help=what)
        one.add_argument("schedule_id", metavar="ID")
        client_options(one)

    alarms = sub.add_parser("alarms", help="list or cancel the alarms my agents set")
    alarm_actions = alarms.add_subparsers(dest="alarms_command", required=True, metavar="ACTION")
    client_options(alarm_actions.add_parser("list", help="my agents' alarms"))
    cancel = alarm_actions.add_parser("cancel", help="cancel a pending alarm")
    cancel.add_argument("alarm_id", metavar="ID")
    client_options(cancel)


def _when(s: ScheduleOut) -> str:
    if s.kind == "interval":
        when = f"every {s.interval_s} s"
    elif s.kind == "at":
        when = f"at {rfc3339_or_none(s.at)}"
    else:
        when = f"cron {s.cron!r} {s.timezone}"
    if s.active_from_hour is not None:
        when += f" {s.active_from_hour}-{s.active_until_hour}h"
    return when


def _line(s: ScheduleOut) -> str:
    state = "paused" if s.paused else "active"
    where = s.conversation_id or f"new conversation in {s.workspace}"
    last = rfc3339_or_none(s.last_tick_at) or "never"
    return f"{s.id}  {state}  {_when(s)}  -> {where}  last: {last}  {s.prompt[:60]!r}"


def _alarm(a: AlarmOut) -> str:
    return f"{a.id}  {a.status}  {rfc3339(a.wake_at)}  {a.conversation_id}  {a.note[:60]!r}"


def _spec(args: argparse.Namespace) -> ScheduleIn:
    start = end = None
    if args.hours:
        first, _, last = args.hours.partition("-")
        start, end = int(first), int(last)
    kind = "interval" if args.every is not None else "at" if args.at is not None else "cron"
    return ScheduleIn(
        kind=kind, prompt=args.prompt, name=args.name, interval_s=args.every, at=args.at,
        cron=args.cron, timezone=args.timezone, active_from_hour=start, active_until_hour=end,
        conversation_id=args.conversation, agent=args.agent, catch_up=not args.skip_missed,
    )  # fmt: skip


def _schedules(client: Client, args: argparse.Namespace, out: TextIO) -> None:
    action = args.schedules_command
    if action == "list":
        found = client.schedules()
        if not found:
            print('no schedules: `signalbox schedules create --every 3600 "..."`', file=out)
        for s in found:
            print(_line(s), file=out)
    elif action == "create":
        print(_line(client.create_schedule(_spec(args))), file=out)
    elif action in ("pause", "resume"):
        patch = SchedulePatch(paused=action == "pause")
        print(_line(client.update_schedule(args.schedule_id, patch)), file=out)
    elif action == "delete":
        client.delete_schedule(args.schedule_id)
        print(f"deleted {args.schedule_id}", file=out)
    elif action == "runs":
        runs = client.schedule_runs(args.schedule_id)
        if not runs:
            print("no runs yet", file=out)
        for r in runs:
            turn = f" turn {r.turn_id} in {r.conversation_id}" if r.turn_id else ""
            error = f" ({r.error})" if r.error else ""
            print(f"{rfc3339(r.tick_at)}  {r.status}{turn}{error}", file=out)
    else:
        raise AssertionError(f"unknown schedules action {action!r}")  # argparse allows no other


def _alarms(client: Client, args: argparse.Namespace, out: TextIO) -> None:
    action = args.alarms_command
    if action == "list":
        found = client.alarms()
        if not found:
            print("no alarms: an agent sets one with its `alarm` tool", file=out)
        for a in found:
            print(_alarm(a), file=out)
    elif action == "cancel":
        print(_alarm(client.cancel_alarm(args.alarm_id)), file=out)
    else:
        raise AssertionError(f"unknown alarms action {action!r}")  # argparse allows no other


def run_schedules(
    client: Client,
    args: argparse.Namespace,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Do one ``schedules`` or ``alarms`` action with ``client`` (closed afterwards)."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        if args.command == "schedules":
            _schedules(client, args, out)
        else:
            _alarms(client, args, out)
        return 0
    except (SignalboxError, ValidationError, ValueError) as exc:
        print(f"signalbox: {exc}", file=err)
        return 1
    finally:
        client.close()
