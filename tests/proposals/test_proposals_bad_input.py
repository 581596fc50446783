"""NUL and control bytes, odd escapes, over-long ids and wrong bodies on every route of the
proposals service (a real process), for each kind of caller: 4xx, never a 5xx or a
dropped connection."""

from __future__ import annotations

from signalbox.services.proposals.app import create_app
from tests.hostile_input import attack, routes
from tests.proposals.conftest import Owner, StartService


def test_every_route_refuses_hostile_input_without_failing(
    start_service: StartService, owner: Owner, internal_token: str
) -> None:
    service = start_service()
    app = create_app()  # only read for its OpenAPI: the routes the running process serves
    assert ("POST", "/internal/proposals") in routes(app)
    callers = {
        "user": owner.auth,
        "internal": {"X-Signalbox-Internal-Token": internal_token},
        "acting for": {
            "X-Signalbox-Internal-Token": internal_token,
            "X-Signalbox-User": owner.user_id,
        },
    }
    wrong = {who: attack(service.base_url, app, headers) for who, headers in callers.items()}
    assert wrong == {who: {} for who in callers}
