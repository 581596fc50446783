"""``signalbox proposals list|show|approve|reject``: proposals through the gateway's API.

Exit status 0 when the request did what was asked, 1 when the proposal is not found, is
in conflict, or the gateway refused (the message on stderr says which).
"""

from __future__ import annotations

import sys
from typing import TextIO

from signalbox.chat_render import proposal_list_line, render_proposal
from signalbox.gateway_api import ApiError, Conflict, ProposalsApi


def _print_lines(lines: list[str], out: TextIO) -> None:
    for line in lines:
        print(line, file=out)


def run_proposals(
    api: ProposalsApi,
    action: str,
    proposal_id: str | None = None,
    reason: str | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Do one ``proposals`` action; the exit status."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        if action == "list":
            pending = api.pending()
            if not pending:
                print("no pending proposals", file=out)
            for proposal in pending:
                print(proposal_list_line(proposal), file=out)
            return 0
        assert proposal_id is not None, f"{action!r} needs a proposal id"
        if action == "show":
            _print_lines(render_proposal(api.get(proposal_id)), out)
        elif action == "approve":
            proposal = api.approve(proposal_id)
            print(f"proposal {proposal_id}: {proposal.get('status')}", file=out)
        elif action == "reject":
            proposal = api.reject(proposal_id, reason)
            print(f"proposal {proposal_id}: {proposal.get('status')}", file=out)
        else:
            raise AssertionError(f"unknown proposals action {action!r}")  # argparse allows no other
        return 0
    except Conflict as exc:
        print(f"signalbox: {exc}", file=err)
        # A stale proposal comes back with the file as it is now: show what changed.
        if exc.body.get("files"):
            _print_lines(render_proposal(exc.body), err)
        return 1
    except ApiError as exc:
        print(f"signalbox: {exc}", file=err)
        return 1
    finally:
        api.close()
