"""``signalbox webhooks list|show|create|delete``: my webhooks, through the SDK's ``Client``.

``create`` prints the signing secret, the one time the gateway shows it (docs/hooks.md says
how a receiver checks a signature with it). Exit status 0 when the request did what was
asked, 1 when the webhook is not found or the gateway refused (a URL inside the
deployment, an unknown event kind: the message on stderr says which).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TextIO

from signalbox.client import Client, SignalboxError
from signalbox.shared.webhooks_api import DeliveryView, EventKindName, WebhookView

EVENT_KINDS: tuple[str, ...] = EventKindName.__args__  # type: ignore[attr-defined]


def add_arguments(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    client_options: Callable[[argparse.ArgumentParser], None],
) -> None:
    """The ``webhooks`` subcommand and its actions (``client_options``: ``--url``/``--token``)."""
    webhooks = sub.add_parser("webhooks", help="list, show, create or delete my webhooks")
    actions = webhooks.add_subparsers(dest="webhooks_command", required=True, metavar="ACTION")
    client_options(actions.add_parser("list", help="my webhooks and each one's last delivery"))
    show = actions.add_parser("show", help="a webhook with its recent deliveries")
    show.add_argument("webhook_id", metavar="ID")
    client_options(show)
    create = actions.add_parser("create", help="send some event kinds to a URL (prints the secret)")
    create.add_argument("webhook_url", metavar="URL")
    create.add_argument(
        "--kinds",
        required=True,
        help=f"comma list of event kinds: {', '.join(EVENT_KINDS)}",
    )
    client_options(create)
    delete = actions.add_parser("delete", help="remove a webhook (what it had queued is dropped)")
    delete.add_argument("webhook_id", metavar="ID")
    client_options(delete)


def _delivery(d: DeliveryView | None) -> str:
    if d is None:
        return "no deliveries yet"
    answer = f" HTTP {d.last_status_code}" if d.last_status_code is not None else ""
    error = f" ({d.last_error})" if d.last_error else ""
    return f"{d.status} after {d.attempts} attempt(s){answer}{error}: {d.kind}"


def _line(hook: WebhookView) -> str:
    return f"{hook.id}  {hook.url}  [{','.join(hook.kinds)}]  last: {_delivery(hook.last_delivery)}"


def run_webhooks(
    client: Client,
    args: argparse.Namespace,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Do one ``webhooks`` action with ``client`` (closed afterwards); the exit status."""
    out = out or sys.stdout
    err = err or sys.stderr
    action = args.webhooks_command
    try:
        if action == "list":
            hooks = client.webhooks()
            if not hooks:
                print(
                    "no webhooks: `signalbox webhooks create URL --kinds turn_finished`", file=out
                )
            for hook in hooks:
                print(_line(hook), file=out)
        elif action == "show":
            detail = client.webhook(args.webhook_id)
            print(_line(detail), file=out)
            for d in detail.deliveries:
                print(f"  {d.id}  {d.created_at}  {d.event_key}  {_delivery(d)}", file=out)
        elif action == "create":
            kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
            created = client.create_webhook(args.webhook_url, kinds)
            print(_line(created), file=out)
            print(
                f"secret: {created.secret}  (shown this once: keep it to check signatures)",
                file=out,
            )
        elif action == "delete":
            gone = client.delete_webhook(args.webhook_id)
            print(f"deleted {gone.id} ({gone.url})", file=out)
        else:
            raise AssertionError(f"unknown webhooks action {action!r}")  # argparse allows no other
        return 0
    except SignalboxError as exc:
        print(f"signalbox: {exc}", file=err)
        return 1
    finally:
        client.close()
