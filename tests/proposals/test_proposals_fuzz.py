"""schemathesis against the service's own OpenAPI spec: whatever arrives, never a 5xx."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from requests.structures import CaseInsensitiveDict
from schemathesis.core.result import Ok
from starlette.testclient import TestClient

from tests.proposals.conftest import Owner, Propose

EXAMPLES_PER_OPERATION = 20  # x ~11 operations: a few seconds, not minutes
CREDENTIAL_HEADERS = {"authorization", "x-signalbox-internal-token", "x-signalbox-user"}


def test_no_input_makes_the_service_fail(
    client: TestClient, owner: Owner, propose: Propose, internal_token: str, tmp_path: Path
) -> None:
    (owner.workspace / "exists.txt").write_text("x\n")
    real = propose(
        owner,
        [
            {"path": "exists.txt", "operation": "update", "after": "y\n"},
            {"path": "new.txt", "operation": "create", "after": "n\n"},
        ],
    ).json()["proposal_id"]
    credentials = [
        {"Authorization": f"Bearer {owner.token}"},
        {"X-Signalbox-Internal-Token": internal_token, "X-Signalbox-User": owner.user_id},
        {"X-Signalbox-Internal-Token": internal_token},
        {},  # whatever the generated headers say
    ]
    schema = schemathesis.openapi.from_asgi("/openapi.json", client.app)
    checked: list[str] = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result  # the spec FastAPI serves is itself valid
        operation = result.ok()
        known: dict[str, Any] = {}
        if "{proposal_id}" in operation.path:
            known["proposal_id"] = st.sampled_from([real, "prop_nope"])
        if "{user_id}" in operation.path:
            known["user_id"] = st.just(owner.user_id)
            known["name"] = st.sampled_from(["default", "not-made-yet"])

        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        @given(
            case=st.one_of(
                operation.as_strategy(generation_mode=schemathesis.GenerationMode.POSITIVE),
                operation.as_strategy(generation_mode=schemathesis.GenerationMode.NEGATIVE),
            ),
            headers=st.sampled_from(credentials),
            params=st.fixed_dictionaries({}, optional=known),
            own_conversation=st.booleans(),
        )
        def call(
            case: schemathesis.Case[Any],
            headers: dict[str, str],
            params: dict[str, Any],
            own_conversation: bool,
        ) -> None:
            if params and isinstance(case.path_parameters, dict):
                case.path_parameters.update(params)
            if own_conversation and isinstance(case.body, dict):
                # Past the ownership check, so paths and contents get fuzzed too.
                case.body.update(user_id=owner.user_id, conversation_id=owner.conversation_id)
            if headers:
                # Ours replace whatever credentials were generated, so routes get past auth.
                generated = {
                    k: v
                    for k, v in (case.headers or {}).items()
                    if k.lower() not in CREDENTIAL_HEADERS
                }
                case.headers = CaseInsensitiveDict({**generated, **headers})
            response = case.call()
            assert response.status_code < 500, (case.method, case.formatted_path, response.text)

        call()
        checked.append(f"{operation.method.upper()} {operation.path}")
    assert "POST /api/proposals/{proposal_id}/approve" in checked
    assert "POST /internal/proposals" in checked
    assert "GET /internal/workspaces/{user_id}/{name}" in checked
    # Nothing escaped the workspace whatever paths were proposed and approved.
    root = tmp_path / "workspaces"
    assert [p for p in tmp_path.rglob("*") if p.is_file() and root not in p.parents] == []
