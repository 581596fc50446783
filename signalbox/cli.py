"""The ``signalbox`` command: runs every service on one machine, and the admin tools."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from signalbox import admin, probe
from signalbox.gateway_api import ApiError, resolve_token, resolve_url
from signalbox.shared.log_config import configure_logging
from signalbox.shared.settings import CommonSettings, SettingsError, load


def _port(value: str) -> int:
    port = int(value)
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port 1-65535, got {value!r}")
    return port


def _client_options(parser: argparse.ArgumentParser) -> None:
    """``--url`` and ``--token``: how a client command reaches the gateway as a user."""
    parser.add_argument(
        "--url",
        help="gateway URL (default: $SIGNALBOX_GATEWAY_URL, else ./var/gateway-url written by "
        "`signalbox up`, else http://127.0.0.1:8000)",
    )
    parser.add_argument(
        "--token",
        help="API token (default: $SIGNALBOX_TOKEN, else ./var/admin-token of `signalbox up`)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand (tests check docker-compose.yml against it)."""
    parser = argparse.ArgumentParser(
        prog="signalbox", description="Signalbox: server-side LLM agents over Celery and Redis."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = sub.add_parser("up", help="run every service on this machine and print a login URL")
    up.add_argument("--port", type=_port, default=8000, help="gateway port (default 8000)")
    up.add_argument(
        "--proposals-port", type=_port, default=None, help="proposals service port (default: free)"
    )
    up.add_argument("--var", type=Path, default=Path("var"), help="state directory (default ./var)")
    up.add_argument(
        "--host", default="127.0.0.1", help="address the services listen on (default 127.0.0.1)"
    )
    up.add_argument(
        "--tools-workers", type=int, default=1, help="tool worker processes (default 1)"
    )

    sub.add_parser("migrate", help="bring SIGNALBOX_DATABASE_URL up to the newest schema")

    users = sub.add_parser("users", help="manage users and their API tokens")
    users_sub = users.add_subparsers(dest="users_command", required=True, metavar="ACTION")
    add = users_sub.add_parser("add", aliases=["create"], help="create a user and print its token")
    add.add_argument("name")
    add.add_argument("--admin", action="store_true", help="with the admin role")
    set_admin = users_sub.add_parser("set-admin", help="give a user the admin role (or --off)")
    set_admin.add_argument("name")
    set_admin.add_argument("--off", action="store_true", help="take the admin role away")
    set_budget = users_sub.add_parser(
        "set-budget", help="set a user's token budgets per UTC day / month"
    )
    set_budget.add_argument("name")
    set_budget.add_argument(
        "--day", type=_number_or_none, default=None, help="tokens per UTC day ('none': no budget)"
    )
    set_budget.add_argument(
        "--month",
        type=_number_or_none,
        default=None,
        help="tokens per calendar month ('none': none)",
    )
    share = users_sub.add_parser(
        "set-share", help="set a user's fair share: turns running at once and weight"
    )
    share.add_argument("name")
    share.add_argument(
        "--running-turns",
        type=_number_or_none,
        default=None,
        help="turns running at once ('none': the deployment's; 0: no limit)",
    )
    share.add_argument(
        "--weight", type=_number_or_none, default=None, help="share weight against other users (1)"
    )
    users_sub.add_parser("list", help="list users and how many live tokens each has")
    revoke = users_sub.add_parser("revoke", help="revoke every token of a user")
    revoke.add_argument("name")
    token = users_sub.add_parser("token", help="print a new extra token for an existing user")
    token.add_argument("name")

    chat = sub.add_parser("chat", help="chat with the agent in this terminal over the WebSocket")
    _client_options(chat)
    chat.add_argument("--conversation", help="continue this conversation (shown from its start)")
    chat.add_argument("--workspace", help="workspace of a new conversation (default: selected)")
    chat.add_argument(
        "--once", metavar="TEXT", help="send one turn, print it to its end, exit 0 if completed"
    )
    decide = chat.add_mutually_exclusive_group()
    decide.add_argument(
        "--approve-all",
        action="store_true",
        help="with --once: approve every proposal and allow every tool that asks",
    )
    decide.add_argument(
        "--reject-all",
        action="store_true",
        help="with --once: reject every proposal and deny every tool that asks",
    )
    chat.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="with --once: give up after this many seconds (default 600)",
    )

    proposals = sub.add_parser("proposals", help="list, show, approve or reject proposals")
    proposals_sub = proposals.add_subparsers(
        dest="proposals_command", required=True, metavar="ACTION"
    )
    _client_options(proposals_sub.add_parser("list", help="my pending proposals"))
    for action, what in (
        ("show", "a proposal with its diff"),
        ("approve", "apply a proposal"),
        ("reject", "reject a proposal"),
    ):
        one = proposals_sub.add_parser(action, help=what)
        one.add_argument("proposal_id", metavar="ID")
        _client_options(one)
        if action == "reject":
            one.add_argument("--reason", help="why, kept with the decision")

    usage = sub.add_parser("usage", help="model tokens and cost, per user (reads the database)")
    usage.add_argument(
        "--by", choices=["user", "conversation", "turn", "model", "purpose"], default="user"
    )
    usage.add_argument("--user", help="only this user's requests")
    usage.add_argument("--since", type=datetime.fromisoformat, help="only from this time on")

    from signalbox.agents_cli import add_arguments as add_agents

    add_agents(sub)
    from signalbox.webhooks_cli import add_arguments as add_webhooks

    add_webhooks(sub, _client_options)
    from signalbox.schedules_cli import add_arguments as add_schedules

    add_schedules(sub, _client_options)

    probe.add_arguments(
        sub.add_parser("probe", help="health checks for docker-compose and Kubernetes probes")
    )
    return parser


def _number_or_none(value: str) -> int | None:
    """A number argument (tokens, turns, a weight), or ``none``."""
    if value.strip().lower() == "none":
        return None
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'none', got {value!r}") from None


def _database_url() -> str:
    return load(CommonSettings).database_url


def _users(args: argparse.Namespace) -> int:
    url = _database_url()
    if args.users_command in ("add", "create"):
        print(admin.add_user(url, args.name, args.admin))
    elif args.users_command == "set-admin":
        admin.set_admin(url, args.name, not args.off)
        print(f"{args.name!r} is {'no longer ' if args.off else ''}an admin")
    elif args.users_command == "set-budget":
        admin.set_budget(url, args.name, args.day, args.month)
        day = "none" if args.day is None else args.day
        month = "none" if args.month is None else args.month
        print(f"budgets of {args.name!r}: day {day}, month {month} (tokens)")
    elif args.users_command == "set-share":
        admin.set_share(url, args.name, args.running_turns, args.weight)
        running = "the deployment's" if args.running_turns is None else args.running_turns
        weight = 1 if args.weight is None else args.weight
        print(f"share of {args.name!r}: running turns {running}, weight {weight}")
    elif args.users_command == "token":
        print(admin.new_token(url, args.name))
    elif args.users_command == "revoke":
        n = admin.revoke_user_tokens(url, args.name)
        print(f"revoked {n} token(s) of {args.name!r}")
    elif args.users_command == "list":
        rows = admin.list_users(url)
        if not rows:
            print("no users yet: `signalbox users add NAME`")
        width = max((len(r.name) for r in rows), default=4)
        for r in rows:
            created = r.created_at.strftime("%Y-%m-%d %H:%M")
            role = "  admin" if r.is_admin else ""
            print(
                f"{r.name:<{width}}  {r.user_id}  created {created}  "
                f"live tokens {r.live_tokens}{role}"
            )
    return 0


def _up(args: argparse.Namespace) -> int:
    # Imported here: the admin commands should not pay for the process supervisor.
    from signalbox.up import UpError, UpOptions, run_up

    options = UpOptions(
        port=args.port,
        proposals_port=args.proposals_port or 0,
        var_dir=args.var,
        host=args.host,
        tools_workers=args.tools_workers,
    )
    try:
        return run_up(options)
    except UpError as exc:
        print(f"signalbox: {exc}", file=sys.stderr)
        return 1


def _chat(args: argparse.Namespace) -> int:
    # Imported here: the admin commands should not pay for the WebSocket client.
    from signalbox.chat import ChatError, ChatOptions, Policy, run_chat

    if (args.approve_all or args.reject_all) and args.once is None:
        print("signalbox: --approve-all and --reject-all go with --once", file=sys.stderr)
        return 2
    policy: Policy = "ask" if args.once is None else "leave"
    if args.approve_all:
        policy = "approve"
    elif args.reject_all:
        policy = "reject"
    options = ChatOptions(
        url=resolve_url(args.url),
        token=resolve_token(args.token),
        conversation_id=args.conversation,
        workspace=args.workspace,
        policy=policy,
        timeout_s=args.timeout,
    )
    try:
        return run_chat(options, once=args.once)
    except ChatError as exc:
        print(f"signalbox: {exc}", file=sys.stderr)
        return 1


def _proposals(args: argparse.Namespace) -> int:
    from signalbox.client import Client
    from signalbox.proposals_cli import run_proposals

    client = Client(resolve_url(args.url), resolve_token(args.token))
    return run_proposals(
        client,
        args.proposals_command,
        getattr(args, "proposal_id", None),
        getattr(args, "reason", None),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``signalbox`` console script."""
    args = build_parser().parse_args(argv)
    # A terminal tool: warnings only, unless SIGNALBOX_LOG_LEVEL asks for more.
    configure_logging("cli", os.environ.get("SIGNALBOX_LOG_LEVEL") or "WARNING")
    try:
        if args.command == "probe":
            return probe.run(args)
        if args.command == "up":
            return _up(args)
        if args.command == "migrate":
            url = _database_url()
            admin.migrate(url)
            print(f"database at {admin.safe_url(url)} is at the newest schema")
            return 0
        if args.command == "users":
            return _users(args)
        if args.command == "chat":
            return _chat(args)
        if args.command == "proposals":
            return _proposals(args)
        if args.command == "usage":
            from signalbox.usage_cli import run_usage

            return run_usage(_database_url(), args.by, args.user, args.since)
        if args.command == "agents":
            from signalbox.agents_cli import run_agents
            from signalbox.client import Client

            def client() -> Client:
                return Client(resolve_url(args.url), resolve_token(args.token))

            return run_agents(args, _database_url, client)
        if args.command == "webhooks":
            from signalbox.client import Client
            from signalbox.webhooks_cli import run_webhooks

            return run_webhooks(Client(resolve_url(args.url), resolve_token(args.token)), args)
        if args.command in ("schedules", "alarms"):
            from signalbox.client import Client
            from signalbox.schedules_cli import run_schedules

            return run_schedules(Client(resolve_url(args.url), resolve_token(args.token)), args)
    except (admin.AdminError, SettingsError, ApiError) as exc:
        print(f"signalbox: {exc}", file=sys.stderr)
        return 1
    raise AssertionError(f"unhandled command {args.command!r}")  # argparse allows no other


if __name__ == "__main__":
    sys.exit(main())
