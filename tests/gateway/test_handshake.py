"""The handshake is refused with HTTP 403 before accept: bad token, reused ticket, bad origin."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import websockets
from websockets.exceptions import InvalidStatus

from tests import http_calls
from tests.gateway.conftest import LiveGateway, bearer, recv

pytestmark = pytest.mark.anyio


async def _refused(url: str, **kwargs: object) -> int:
    with pytest.raises(InvalidStatus) as refused:
        await websockets.connect(url, **kwargs)  # type: ignore[arg-type]
    return refused.value.response.status_code


async def _pings(url: str, **kwargs: object) -> bool:
    async with await websockets.connect(url, **kwargs) as ws:  # type: ignore[arg-type]
        await ws.send(json.dumps({"type": "ping", "req": "1"}))
        reply = await recv(ws)
        return bool(reply["type"] == "pong")


async def test_wrong_or_missing_token_is_403(gateway: LiveGateway) -> None:
    assert await _refused(gateway.ws_url, additional_headers=bearer("sbt_wrong")) == 403
    assert await _refused(gateway.ws_url) == 403
    assert await _refused(gateway.ws_url + "?ticket=made-up") == 403


async def test_a_ticket_works_once(
    gateway: LiveGateway, make_user: Callable[[], tuple[str, str]]
) -> None:
    _, token = make_user()
    async with http_calls.AsyncClient(base_url=gateway.url) as http:
        assert (await http.post("/api/ws-tickets")).status_code == 401
        response = await http.post("/api/ws-tickets", headers=bearer(token))
    assert response.status_code == 200
    body = response.json()
    assert body["expires_in_s"] == 30
    url = f"{gateway.ws_url}?ticket={body['ticket']}"
    assert await _pings(url)
    assert await _refused(url) == 403


async def test_origin_must_be_allowed(
    start_gateway: Callable[..., LiveGateway], make_user: Callable[[], tuple[str, str]]
) -> None:
    gateway = start_gateway(allowed_origins=["https://app.example"])
    _, token = make_user()
    headers = bearer(token)
    refused = await _refused(
        gateway.ws_url, additional_headers=headers, origin="https://evil.example"
    )
    assert refused == 403
    assert await _pings(gateway.ws_url, additional_headers=headers, origin="https://app.example")
    # The gateway's own origin (its web UI) is always allowed.
    assert await _pings(gateway.ws_url, additional_headers=headers, origin=gateway.url)


async def test_default_allows_only_the_gateways_own_origin(
    gateway: LiveGateway, make_user: Callable[[], tuple[str, str]]
) -> None:
    _, token = make_user()
    headers = bearer(token)
    assert await _pings(gateway.ws_url, additional_headers=headers, origin=gateway.url)
    assert (
        await _refused(gateway.ws_url, additional_headers=headers, origin="http://localhost:1")
        == 403
    )


@pytest.mark.parametrize("enabled", [False, True], ids=["default", "deflate-on"])
async def test_compression_is_declined_unless_turned_on_and_clients_connect_either_way(
    start_gateway: Callable[..., LiveGateway],
    make_user: Callable[[], tuple[str, str]],
    enabled: bool,
) -> None:
    """A client offering permessage-deflate (as browsers do) is answered without it by
    default (SIGNALBOX_WS_PER_MESSAGE_DEFLATE), and still talks; with it on, it gets it."""
    gateway = start_gateway(ws_per_message_deflate=enabled)
    _, token = make_user()
    async with await websockets.connect(
        gateway.ws_url, additional_headers=bearer(token), compression="deflate"
    ) as ws:
        extensions = [e.name for e in ws.protocol.extensions]
        assert extensions == (["permessage-deflate"] if enabled else [])
        await ws.send(json.dumps({"type": "ping", "req": "1"}))
        assert (await recv(ws))["type"] == "pong"
