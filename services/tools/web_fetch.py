"""web_fetch: a URL's readable text, without letting the model reach inside the deployment.

SSRF is what this module is shaped against. The model chooses the URL, and the worker sits
on a network where Redis, the database, the proposals service and a cloud metadata endpoint
answer. So:

- the host is resolved ONCE (``Resolver``, injectable), every address it resolves to must be
  global (``refusal``: no loopback, private, link-local, metadata, multicast, reserved,
  shared, unspecified, nor an IPv6 form embedding such an IPv4 address), and the connection
  is made to the address that was checked: the URL is rewritten to it, the ``Host`` header
  and TLS SNI (and certificate check) keep the name. A DNS answer that changes between the
  check and the connection (rebinding) is never asked for;
- no proxy from the environment (``trust_env=False``): a proxy would do its own resolving;
- redirects are followed here, at most ``MAX_REDIRECTS``, each target resolved and checked
  as above, ``http``/``https`` only;
- the body is read as a stream up to ``max_bytes`` (decompressed size: gzip and deflate are
  decoded here with a bound, so a small compressed body cannot expand in memory), within a
  deadline for the whole fetch, redirects included.

HTML becomes text with BeautifulSoup (the standard library's parser): scripts, styles and
other non-content elements dropped, one line per block.
"""

from __future__ import annotations

import codecs
import ipaddress
import re
import socket
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from urllib.parse import urljoin

import httpx
from bs4 import BeautifulSoup
from pydantic import BaseModel, Field

from signalbox.services.tools.registry import Registry, ToolContext, ToolError, ToolTimeout
from signalbox.shared.public_address import IPAddress, refusal

registry = Registry()

Resolver = Callable[[str, int], list[str]]

MAX_REDIRECTS = 5
MAX_URL_CHARS = 2048
CHUNK_BYTES = 16 * 1024
USER_AGENT = "Signalbox-web_fetch/1 (+https://github.com/signalbox)"
DROPPED_TAGS = ("script", "style", "noscript", "template", "iframe", "svg", "canvas", "head")
TEXT_TYPES = ("text/", "application/json", "application/xml", "application/xhtml+xml")


class FetchRefused(ToolError):
    """The URL (or a redirect's target) points where web_fetch never goes."""


@dataclass(frozen=True)
class FetchLimits:
    """How much and how long one fetch may take."""

    max_bytes: int
    timeout_s: float
    connect_timeout_s: float = 5.0


@dataclass(frozen=True)
class Fetched:
    """What came back: the final URL, its status and type, and the body (maybe cut)."""

    url: str
    status: int
    content_type: str
    charset: str | None
    body: bytes
    truncated: bool


def system_resolver(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to now (A and AAAA)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ToolError(f"cannot resolve {host!r}: {exc.strerror}") from None
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _checked(url: httpx.URL, resolver: Resolver) -> IPAddress:
    """The one address ``url`` will be fetched from, every resolved address checked."""
    if url.scheme not in ("http", "https"):
        raise FetchRefused(f"only http and https URLs are fetched, got {str(url)!r}")
    host = url.raw_host.decode("ascii")  # IDNA-encoded: what DNS and SNI take
    if not host:
        raise FetchRefused(f"the URL has no host: {str(url)!r}")
    if url.userinfo:
        raise FetchRefused("URLs with a user name or password are not fetched")
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        found = [ipaddress.ip_address(host)]
    except ValueError:
        found = [ipaddress.ip_address(a.split("%", 1)[0]) for a in resolver(host, port)]
    if not found:
        raise ToolError(f"{host!r} resolves to no address")
    for address in found:
        why = refusal(address)
        if why is not None:
            raise FetchRefused(
                f"refusing to fetch {str(url)!r}: {host} resolves to {address}, which {why}"
            )
    return found[0]


def _decoder(encoding: str) -> Callable[[bytes, int], bytes] | None:
    """A bounded decoder of the response's content encoding (None: identity)."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return None
    if encoding not in ("gzip", "x-gzip", "deflate"):
        raise ToolError(f"the server sent an encoding that was not asked for: {encoding!r}")
    inflater = zlib.decompressobj(47 if encoding != "deflate" else zlib.MAX_WBITS)
    pending = b""

    def decode(data: bytes, room: int) -> bytes:
        nonlocal pending
        pending += data
        out = inflater.decompress(pending, room)  # never more than ``room`` bytes
        pending = inflater.unconsumed_tail
        return out

    return decode


def _read(response: httpx.Response, limits: FetchLimits, deadline: float) -> tuple[bytes, bool]:
    """At most ``limits.max_bytes`` of the (decoded) body; True if there was more."""
    decode = _decoder(response.headers.get("content-encoding", ""))
    body = bytearray()
    # As they arrive (no re-chunking): a server dripping bytes meets the deadline.
    chunks: Iterator[bytes] = response.iter_raw()
    for raw in chunks:
        if time.monotonic() > deadline:
            raise ToolTimeout(f"web_fetch took longer than {limits.timeout_s:g} s")
        room = limits.max_bytes - len(body)
        data = raw if decode is None else decode(raw, room + 1)
        body += data[: room + 1]
        if len(body) > limits.max_bytes:
            return bytes(body[: limits.max_bytes]), True
    return bytes(body), False


def _text_codec(charset: str | None) -> str | None:
    """``charset`` if Python knows it as a text encoding, else None (read as UTF-8): a page's
    ``charset=bogus`` (or ``hex``, a bytes-to-bytes codec) is the page's error, not ours."""
    if charset is None:
        return None
    try:
        info = codecs.lookup(charset)
    except LookupError:
        return None
    return charset if info._is_text_encoding else None


def fetch(
    url: str,
    limits: FetchLimits,
    resolver: Resolver = system_resolver,
    transport: httpx.BaseTransport | None = None,
) -> Fetched:
    """GET ``url`` (following checked redirects) within ``limits``; refusals are ``ToolError``s."""
    deadline = time.monotonic() + limits.timeout_s
    try:
        current = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ToolError(f"not a valid URL: {url!r} ({exc})") from None
    timeout = httpx.Timeout(limits.timeout_s, connect=limits.connect_timeout_s)
    with httpx.Client(
        transport=transport, trust_env=False, follow_redirects=False, timeout=timeout
    ) as client:
        for _hop in range(MAX_REDIRECTS + 1):
            left = deadline - time.monotonic()
            if left <= 0:  # the limit is the whole fetch's: a chain of slow hops meets it too
                raise ToolTimeout(f"web_fetch took longer than {limits.timeout_s:g} s")
            address = _checked(current, resolver)
            host = current.raw_host.decode("ascii")
            pinned = current.copy_with(host=str(address))
            headers = {
                "Host": current.netloc.decode("ascii").rsplit("@", 1)[-1],
                "User-Agent": USER_AGENT,
                "Accept": "text/html, text/*;q=0.9, application/json;q=0.8, */*;q=0.1",
                "Accept-Encoding": "gzip, deflate",
            }
            extensions = {"sni_hostname": host} if current.scheme == "https" else {}
            request = client.build_request(
                "GET",
                pinned,
                headers=headers,
                extensions=extensions,
                timeout=httpx.Timeout(left, connect=min(left, limits.connect_timeout_s)),
            )
            try:
                response = client.send(request, stream=True)
            except httpx.TimeoutException:
                raise ToolTimeout(f"web_fetch timed out reaching {host!r}") from None
            except httpx.HTTPError as exc:
                raise ToolError(f"could not fetch {str(current)!r}: {exc}") from None
            try:
                if response.is_redirect:
                    location = response.headers.get("location", "")
                    current = httpx.URL(urljoin(str(current), location))
                    continue
                body, truncated = _read(response, limits, deadline)
            except httpx.TimeoutException:
                raise ToolTimeout(f"web_fetch timed out reading {str(current)!r}") from None
            except httpx.HTTPError as exc:
                raise ToolError(f"could not read {str(current)!r}: {exc}") from None
            finally:
                response.close()
            content_type = response.headers.get("content-type", "")
            mime = content_type.split(";", 1)[0].strip().lower()
            charset = _text_codec(response.charset_encoding)
            return Fetched(str(current), response.status_code, mime, charset, body, truncated)
    raise ToolError(f"more than {MAX_REDIRECTS} redirects from {url!r}")


def readable(fetched: Fetched) -> str:
    """The body as text a model can read: HTML without its markup, scripts and styles."""
    if not fetched.content_type.startswith(TEXT_TYPES) and fetched.content_type:
        raise ToolError(
            f"{fetched.url!r} is {fetched.content_type!r}, not text; web_fetch returns text only"
        )
    if fetched.content_type in ("text/html", "application/xhtml+xml") or (
        not fetched.content_type and b"<html" in fetched.body[:1024].lower()
    ):
        soup = BeautifulSoup(fetched.body, "html.parser", from_encoding=fetched.charset)
        title = soup.title.get_text(strip=True) if soup.title else ""
        for tag in soup(DROPPED_TAGS):
            tag.decompose()
        text = soup.get_text("\n")
        lines = [re.sub(r"[ \t\u00a0]+", " ", line).strip() for line in text.splitlines()]
        body = "\n".join(line for line in lines if line)
        return (f"# {title}\n\n" if title else "") + body
    return fetched.body.decode(fetched.charset or "utf-8", errors="replace")


class WebFetchInput(BaseModel):
    """Input of ``web_fetch``."""

    url: str = Field(max_length=MAX_URL_CHARS, description="an http or https URL")


@registry.tool(
    name="web_fetch",
    description=(
        "Fetch a public web page (http/https) and return its readable text (HTML without "
        "markup, scripts or styles; other text as is). Size and time are limited; addresses "
        "inside private networks are refused."
    ),
    timeout_s=30,
    mode="confirm",
    side_effect="read",
)
def web_fetch(args: WebFetchInput, ctx: ToolContext) -> str:
    """GET ``args.url`` as ``fetch`` does and return ``readable`` text with a header line."""
    settings = ctx.settings
    limits = FetchLimits(
        max_bytes=settings.web_fetch_max_bytes,
        timeout_s=max(1.0, min(settings.web_fetch_timeout_s, ctx.timeout_s - 1.0)),
    )
    fetched = fetch(args.url, limits)
    text = readable(fetched)
    if fetched.status >= 400:
        raise ToolError(f"{fetched.url} answered HTTP {fetched.status}:\n{text[:2000]}")
    note = (
        f"\n[cut at {limits.max_bytes} bytes of the page: the rest was not read]"
        if fetched.truncated
        else ""
    )
    kind = fetched.content_type or "no type"
    return f"{fetched.url} (HTTP {fetched.status}, {kind})\n\n{text}{note}"
