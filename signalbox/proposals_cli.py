"""``signalbox proposals list|show|approve|reject``: proposals through the SDK's ``Client``.

Exit status 0 when the request did what was asked, 1 when the proposal is not found, is
in conflict, or the gateway refused (the message on stderr says which).
"""

from __future__ import annotations

import sys
from typing import TextIO

from signalbox.chat_render import proposal_list_line, render_proposal
from signalbox.client import Client, Conflict, SignalboxError


def _print_lines(lines: list[str], out: TextIO) -> None:
    for line in lines:
        print(line, file=out)


def run_proposals(
    client: Client,
    action: str,
    proposal_id: str | None = None,
    reason: str | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Do one ``proposals`` action with ``client`` (closed afterwards); the exit status."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        if action == "list":
            pending = client.pending_proposals()
            if not pending:
                print("no pending proposals", file=out)
            for proposal in pending:
                print(proposal_list_line(proposal.model_dump(mode="json")), file=out)
            return 0
        assert proposal_id is not None, f"{action!r} needs a proposal id"
        if action == "show":
            _print_lines(render_proposal(client.proposal(proposal_id).model_dump(mode="json")), out)
        elif action == "approve":
            print(f"proposal {proposal_id}: {client.approve(proposal_id).status}", file=out)
        elif action == "reject":
            print(f"proposal {proposal_id}: {client.reject(proposal_id, reason).status}", file=out)
        else:
            raise AssertionError(f"unknown proposals action {action!r}")  # argparse allows no other
        return 0
    except Conflict as exc:
        print(f"signalbox: {exc}", file=err)
        # A stale proposal comes back with the file as it is now: show what changed.
        if exc.body.get("files"):
            _print_lines(render_proposal(exc.body), err)
        return 1
    except SignalboxError as exc:
        print(f"signalbox: {exc}", file=err)
        return 1
    finally:
        client.close()
