"""Every acting WebSocket frame has its HTTP route: the table of docs/protocol.md names one
for each frame, and each route it names is in the gateway's OpenAPI. Times in HTTP bodies
are written as the events write them."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from signalbox.shared.protocol import CLIENT_FRAME_TYPES
from tests import http_calls
from tests.gateway.conftest import LiveGateway, bearer
from tests.shared.test_timestamps import FORMAT
from tests.test_protocol_doc import section, table_rows

PROTOCOL = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
NOT_ACTIONS = {"ping", "unsubscribe"}  # a socket's own housekeeping: nothing to do over HTTP
_ROUTE = re.compile(r"`(GET|POST|PATCH|DELETE) (/[^`]+)`")


def _documented() -> dict[str, list[tuple[str, str]]]:
    rows = table_rows(section(PROTOCOL.read_text(), "Each action over HTTP (added)"))
    return {row[0].strip("`"): _ROUTE.findall(row[1]) for row in rows}


def test_every_acting_frame_has_a_documented_route() -> None:
    documented = _documented()
    assert set(documented) == set(CLIENT_FRAME_TYPES) - NOT_ACTIONS
    assert all(documented.values())


def test_every_documented_route_is_served(gateway: LiveGateway) -> None:
    # Building the whole app's schema takes seconds of CPU on a loaded machine (first request).
    spec = http_calls.get(f"{gateway.url}/openapi.json", timeout=60).json()
    served = {
        (method.upper(), re.sub(r"\{[^}]+\}", "{id}", path))
        for path, operations in spec["paths"].items()
        for method in operations
    }
    for frame, routes in _documented().items():
        for method, path in routes:
            assert (method, path) in served, f"{frame}: {method} {path}"


def test_times_in_http_bodies_are_written_like_the_events(
    gateway: LiveGateway, make_user: Callable[[], tuple[str, str]]
) -> None:
    _, token = make_user()
    with http_calls.Client(base_url=gateway.url, headers=bearer(token)) as http:
        created = http.post("/api/conversations", json={"title": "t"})
        assert created.status_code == 201, created.text
        conversation_id = created.json()["conversation_id"]
        listed = http.get("/api/conversations").json()
        [event] = http.get(f"/api/conversations/{conversation_id}/events").json()
        archived = http.delete(f"/api/conversations/{conversation_id}").json()
    for moment in (created.json()["created_at"], listed[0]["created_at"], event["ts"]):
        assert FORMAT.match(moment), moment
    assert FORMAT.match(archived["archived_at"])
