"""NUL and control bytes, odd escapes, over-long ids and wrong bodies on every gateway route:
each answers 4xx (or, for a query or body it may ignore, anything below 500), never a 5xx
or a dropped connection."""

from __future__ import annotations

from collections.abc import Callable

from tests import rawhttp
from tests.gateway.conftest import LiveGateway, bearer
from tests.hostile_input import BAD_SEGMENTS, attack, routes

Users = Callable[[], tuple[str, str]]


def test_every_route_refuses_hostile_input_without_failing(
    gw: LiveGateway, make_user: Users
) -> None:
    _, token = make_user()
    attacked = routes(gw.app)
    assert ("POST", "/api/conversations/{conversation_id}/turns") in attacked
    assert any(path.startswith("/api/proposals/") for _method, path in attacked)
    assert attack(gw.url, gw.app, bearer(token)) == {}


def test_static_files_and_the_ui_refuse_hostile_paths(gw: LiveGateway) -> None:
    for segment in BAD_SEGMENTS:
        for target in (f"/static/{segment}", f"/{segment}", f"/static/{segment}/app.js"):
            status = rawhttp.send(gw.url, "GET", target).status
            assert 400 <= status < 500, (target, status)
