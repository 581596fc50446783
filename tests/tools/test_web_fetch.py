"""web_fetch as a hostile model meets it: every way to reach inside the deployment is refused
(a local server, a name resolving to a private address, DNS rebinding, a redirect to the
metadata service), and a page too large or too slow is cut, without buffering it whole."""

from __future__ import annotations

import gzip
import ipaddress
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from signalbox.services.tools.registry import ToolError, ToolTimeout
from signalbox.services.tools.web_fetch import (
    CHUNK_BYTES,
    FetchLimits,
    FetchRefused,
    Resolver,
    fetch,
    readable,
    registry,
)
from signalbox.shared.public_address import refusal
from tests.tools.conftest import ToolEnv

PUBLIC = "93.184.215.14"  # a global unicast address; no test connects to it for real
LIMITS = FetchLimits(max_bytes=64 * 1024, timeout_s=5.0, connect_timeout_s=1.0)


class _Counting(BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self) -> None:
        self.hits.append(self.path)
        body = b"<html><body>internal admin page</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def local_server() -> Iterator[tuple[int, list[str]]]:
    """A real HTTP server on 127.0.0.1 (an internal service), and the paths it was asked."""
    hits: list[str] = []
    handler = type("Handler", (_Counting,), {"hits": hits})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], hits
    finally:
        server.shutdown()
        server.server_close()


def _page(status: int, body: bytes | str = b"", **headers: str) -> httpx.Response:
    """A response whose body streams (as from a socket), not one read in advance."""
    data = body.encode() if isinstance(body, str) else body
    return httpx.Response(status, headers=headers, content=iter([data]))


class _Recorder:
    """A transport standing for the network: what was asked of it, answered by ``reply``."""

    def __init__(self, reply: dict[str, httpx.Response]) -> None:
        self.reply = reply
        self.requests: list[httpx.Request] = []
        self.transport = httpx.MockTransport(self._handle)

    def _handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.reply[request.headers["host"]]


def _resolver(table: dict[str, list[list[str]]]) -> tuple[list[str], Resolver]:
    """A resolver answering from ``table`` (one answer per call, the last repeated)."""
    asked: list[str] = []

    def resolve(host: str, port: int) -> list[str]:
        asked.append(host)
        answers = table[host]
        return answers[min(len([h for h in asked if h == host]) - 1, len(answers) - 1)]

    return asked, resolve


def test_a_local_http_server_is_refused_and_never_asked(
    tool_env: ToolEnv, local_server: tuple[int, list[str]]
) -> None:
    port, hits = local_server
    for url in (
        f"http://127.0.0.1:{port}/",
        f"http://localhost:{port}/admin",
        f"http://[::ffff:127.0.0.1]:{port}/",
        f"http://2130706433:{port}/",  # 127.0.0.1 as one number
    ):
        result = tool_env.run("web_fetch", url=url)
        assert result.status == "error" and "refusing to fetch" in (result.error or ""), result
    assert hits == []


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "10.0.0.5", "172.16.3.4", "192.168.1.1", "169.254.169.254", "100.64.0.1",
     "0.0.0.0", "224.0.0.251", "240.0.0.1", "255.255.255.255", "::1", "fe80::1", "fd00::1",
     "::ffff:10.0.0.1", "64:ff9b::a00:1", "2002:7f00:1::1", "::"],
)  # fmt: skip
def test_no_inside_address_is_ever_allowed(address: str) -> None:
    assert refusal(ipaddress.ip_address(address)) is not None


@pytest.mark.parametrize("address", [PUBLIC, "1.1.1.1", "2606:4700:4700::1111"])
def test_public_addresses_are_allowed(address: str) -> None:
    assert refusal(ipaddress.ip_address(address)) is None


def test_a_name_resolving_to_a_public_and_a_private_address_is_refused() -> None:
    _, resolve = _resolver({"mixed.example": [[PUBLIC, "10.0.0.7"]]})
    net = _Recorder({})
    with pytest.raises(FetchRefused, match=r"10\.0\.0\.7"):
        fetch("http://mixed.example/", LIMITS, resolve, net.transport)
    assert net.requests == []


def test_dns_rebinding_meets_the_address_that_was_checked(
    local_server: tuple[int, list[str]],
) -> None:
    """The name answers public first, then 127.0.0.1: it is resolved once, and the request
    goes to the public address it was checked for, with the name in Host."""
    port, hits = local_server
    asked, resolve = _resolver({"rebind.example": [[PUBLIC], ["127.0.0.1"]]})
    net = _Recorder({f"rebind.example:{port}": _page(200, "public page")})
    got = fetch(f"http://rebind.example:{port}/", LIMITS, resolve, net.transport)
    assert asked == ["rebind.example"]
    [request] = net.requests
    assert (request.url.host, request.headers["host"]) == (PUBLIC, f"rebind.example:{port}")
    assert got.body == b"public page" and hits == []


def test_https_keeps_the_name_for_sni_and_the_certificate() -> None:
    _, resolve = _resolver({"secure.example": [[PUBLIC]]})
    net = _Recorder({"secure.example": _page(200, "ok")})
    fetch("https://secure.example/x", LIMITS, resolve, net.transport)
    [request] = net.requests
    assert request.url.host == PUBLIC and request.extensions["sni_hostname"] == "secure.example"


@pytest.mark.parametrize(
    "target",
    ["http://169.254.169.254/latest/meta-data/", "http://localhost/", "http://10.1.2.3:6379/",
     "file:///etc/passwd", "gopher://public.example/"],
)  # fmt: skip
def test_a_redirect_inside_is_refused_before_it_is_followed(target: str) -> None:
    _, resolve = _resolver({"public.example": [[PUBLIC]], "localhost": [["127.0.0.1"]]})
    net = _Recorder({"public.example": _page(302, Location=target)})
    with pytest.raises(FetchRefused):
        fetch("http://public.example/start", LIMITS, resolve, net.transport)
    assert [r.headers["host"] for r in net.requests] == ["public.example"]


def test_redirects_are_followed_each_one_checked() -> None:
    asked, resolve = _resolver({"a.example": [[PUBLIC]], "b.example": [["1.1.1.1"]]})
    net = _Recorder(
        {
            "a.example": _page(301, Location="http://b.example/end"),
            "b.example": _page(200, "arrived", **{"Content-Type": "text/plain"}),
        }
    )
    got = fetch("http://a.example/", LIMITS, resolve, net.transport)
    assert (got.url, got.body, asked) == (
        "http://b.example/end",
        b"arrived",
        ["a.example", "b.example"],
    )


def test_the_size_limit_stops_reading_an_endless_body() -> None:
    pulled = 0

    def endless() -> Iterator[bytes]:
        nonlocal pulled
        while True:
            pulled += 1
            yield b"x" * CHUNK_BYTES

    _, resolve = _resolver({"big.example": [[PUBLIC]]})
    net = _Recorder(
        {
            "big.example": httpx.Response(
                200, content=endless(), headers={"Content-Type": "text/plain"}
            )
        }
    )
    got = fetch("http://big.example/", LIMITS, resolve, net.transport)
    assert got.truncated and len(got.body) == LIMITS.max_bytes
    assert pulled <= LIMITS.max_bytes // CHUNK_BYTES + 2


def test_a_compressed_bomb_is_decoded_only_up_to_the_limit() -> None:
    bomb = gzip.compress(b"\0" * (64 * 1024 * 1024))  # 64 MiB of zeros in ~64 KiB
    _, resolve = _resolver({"bomb.example": [[PUBLIC]]})
    net = _Recorder(
        {
            "bomb.example": _page(
                200, bomb, **{"Content-Encoding": "gzip", "Content-Type": "text/plain"}
            )
        }
    )
    got = fetch("http://bomb.example/", LIMITS, resolve, net.transport)
    assert got.truncated and len(got.body) == LIMITS.max_bytes


def test_a_slow_drip_ends_at_the_time_limit() -> None:
    drops = 600  # 30 s of drip at the least: a fetch without a limit would read them all
    dripped: list[bytes] = []

    def drip() -> Iterator[bytes]:
        for _ in range(drops):
            time.sleep(0.05)  # the server's slowness under test, not a synchronisation
            dripped.append(b".")
            yield b"."

    _, resolve = _resolver({"slow.example": [[PUBLIC]]})
    net = _Recorder({"slow.example": httpx.Response(200, content=drip())})
    limits = FetchLimits(max_bytes=1024 * 1024, timeout_s=0.5)
    with pytest.raises(ToolTimeout):
        fetch("http://slow.example/", limits, resolve, net.transport)
    assert len(dripped) < drops, "cut at the limit, not read to its end"


def test_html_becomes_text_without_scripts_or_styles() -> None:
    html = (
        "<html><head><title>Release notes</title><style>body{color:red}</style>"
        "<script>steal()</script></head><body><h1>Version 2</h1><p>Faster&nbsp;  start-up.</p>"
        "<noscript>enable js</noscript><ul><li>one</li><li>two</li></ul></body></html>"
    )
    _, resolve = _resolver({"docs.example": [[PUBLIC]]})
    net = _Recorder({"docs.example": _page(200, html, **{"Content-Type": "text/html"})})
    text = readable(fetch("http://docs.example/", LIMITS, resolve, net.transport))
    assert text == "# Release notes\n\nVersion 2\nFaster start-up.\none\ntwo"


def test_binary_is_refused() -> None:
    _, resolve = _resolver({"img.example": [[PUBLIC]]})
    net = _Recorder({"img.example": _page(200, b"\x89PNG", **{"Content-Type": "image/png"})})
    with pytest.raises(ToolError, match="not text"):
        readable(fetch("http://img.example/", LIMITS, resolve, net.transport))


def test_web_fetch_asks_a_human_first() -> None:
    tool = registry.get("web_fetch")
    assert tool is not None and tool.spec.mode == "confirm"


@pytest.mark.parametrize("charset", ["bogus", "hex", "rot13"])
@pytest.mark.parametrize("mime", ["text/plain", "text/html"])
def test_an_unknown_charset_is_read_as_utf8_not_a_tool_bug(charset: str, mime: str) -> None:
    _, resolve = _resolver({"odd.example": [[PUBLIC]]})
    body = "<html><body>caf\u00e9</body></html>" if mime == "text/html" else "caf\u00e9"
    content_type = f"{mime}; charset={charset}"
    net = _Recorder({"odd.example": _page(200, body, **{"Content-Type": content_type})})
    fetched = fetch("http://odd.example/", LIMITS, resolve, net.transport)
    assert readable(fetched) == "caf\u00e9"


def test_the_deadline_holds_across_redirect_hops() -> None:
    """Each hop answers within the time limit, the chain of them does not: the fetch ends at
    the limit for the whole fetch, not a limit per hop."""
    hops: list[str] = []

    def slow_hop(request: httpx.Request) -> httpx.Response:
        hops.append(request.headers["host"])
        time.sleep(0.3)  # a slow server before its headers, under test
        if len(hops) < 5:
            return httpx.Response(302, headers={"Location": f"http://h{len(hops)}.example/"})
        return httpx.Response(200, content=b"arrived", headers={"Content-Type": "text/plain"})

    def resolve(host: str, port: int) -> list[str]:
        return [PUBLIC]

    limits = FetchLimits(max_bytes=1024, timeout_s=0.5)
    with pytest.raises(ToolTimeout):
        fetch("http://h0.example/", limits, resolve, httpx.MockTransport(slow_hop))
    # The five hops take 1.5 s at the least: a limit per hop would have let all of them through.
    assert len(hops) < 5, hops
