"""schemathesis against the service's own OpenAPI, on a real process: whatever arrives, no 5xx."""

from __future__ import annotations

from pathlib import Path

from tests.openapi_fuzz import fuzz_every_operation
from tests.proposals.conftest import Owner, Propose, StartService


def test_no_input_makes_the_service_fail(
    start_service: StartService,
    owner: Owner,
    propose: Propose,
    internal_token: str,
    tmp_path: Path,
) -> None:
    (owner.workspace / "exists.txt").write_text("x\n")
    real = propose(
        owner,
        [
            {"path": "exists.txt", "operation": "update", "after": "y\n"},
            {"path": "new.txt", "operation": "create", "after": "n\n"},
        ],
    ).json()["proposal_id"]
    service = start_service()
    checked = fuzz_every_operation(
        service.url("/openapi.json"),
        credentials=[
            {"Authorization": f"Bearer {owner.token}"},
            {"X-Signalbox-Internal-Token": internal_token, "X-Signalbox-User": owner.user_id},
            {"X-Signalbox-Internal-Token": internal_token},
            {},  # whatever the generated headers say
        ],
        known={
            "proposal_id": [real, "prop_nope"],
            "user_id": [owner.user_id],
            "name": ["default", "not-made-yet"],
        },
        # Past the ownership check, so paths and contents get fuzzed too.
        body_overrides={"user_id": owner.user_id, "conversation_id": owner.conversation_id},
    )
    assert "POST /api/proposals/{proposal_id}/approve" in checked
    assert "POST /internal/proposals" in checked
    assert "GET /internal/workspaces/{user_id}/{name}" in checked
    # Nothing escaped the workspace whatever paths were proposed and approved.
    root = tmp_path / "workspaces"
    outside = [p for p in tmp_path.rglob("*") if p.is_file() and root not in p.parents]
    assert [p for p in outside if p.suffix != ".log"] == []
