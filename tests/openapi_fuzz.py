"""schemathesis against a live service's own OpenAPI, over real HTTP: whatever arrives, no 5xx.

Every operation the service publishes gets a bounded, fixed set of examples (hypothesis
derandomized, no example database), valid and invalid by turns, sent with each of the given
credentials; ids the test knows to exist are mixed in, so requests get past the ownership
checks and reach the code behind them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from requests.structures import CaseInsensitiveDict
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok

EXAMPLES_PER_OPERATION = 20  # x ~25 operations: seconds, not minutes
CALL_TIMEOUT_S = 10.0
CREDENTIAL_HEADERS = {"authorization", "x-signalbox-internal-token", "x-signalbox-user"}


def fuzz_every_operation(
    openapi_url: str,
    credentials: Sequence[Mapping[str, str]],
    known: Mapping[str, Sequence[str]],
    body_overrides: Mapping[str, Any] | None = None,
    skip_known: frozenset[str] = frozenset(),
    examples: int = EXAMPLES_PER_OPERATION,
) -> list[str]:
    """Run ``not_a_server_error`` on every operation; the ``METHOD /path`` of each one run.

    ``known`` maps a path parameter to values that exist; ``body_overrides`` is merged into
    a generated JSON object body half the time; operations in ``skip_known`` (``METHOD
    /path``) only ever get generated values (a live event stream would never end).
    """
    schema = schemathesis.openapi.from_url(openapi_url)
    checked: list[str] = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result  # the spec the service serves is itself valid
        operation = result.ok()
        name = f"{operation.method.upper()} {operation.path}"
        params = {} if name in skip_known else {
            key: st.sampled_from(list(values))
            for key, values in known.items()
            if f"{{{key}}}" in operation.path
        }  # fmt: skip

        @settings(
            max_examples=examples,
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
            headers=st.sampled_from(list(credentials)),
            chosen=st.fixed_dictionaries({}, optional=params),
            override_body=st.booleans(),
        )
        def call(
            case: schemathesis.Case[Any],
            headers: Mapping[str, str],
            chosen: dict[str, str],
            override_body: bool,
        ) -> None:
            if chosen and isinstance(case.path_parameters, dict):
                case.path_parameters.update(chosen)
            if body_overrides and override_body and isinstance(case.body, dict):
                case.body.update(body_overrides)
            # Ours replace whatever credentials were generated, so routes get past auth.
            generated = {
                k: v for k, v in (case.headers or {}).items() if k.lower() not in CREDENTIAL_HEADERS
            }
            case.headers = CaseInsensitiveDict({**generated, **headers})
            case.call_and_validate(checks=[not_a_server_error], timeout=CALL_TIMEOUT_S)

        call()
        checked.append(name)
    return checked
