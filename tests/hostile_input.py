"""Hostile bytes for every route of an app: each path parameter, the query string, the body.

Routes are read from the app's own OpenAPI, so a route added later is attacked too without
anyone remembering to list it. Every request goes out raw (``tests.rawhttp``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from fastapi import FastAPI

from tests import rawhttp

# Percent-encoded as they would arrive on the wire.
BAD_SEGMENTS = [
    "%00",
    "a%00b",
    "%01",
    "%1F",
    "%7F",
    "%0D%0A",
    "%1B%5B2J",
    "%FF",
    "%C0%AF",
    "%E2%80%AE",
    "%25",
    "%2500",
    "..%2F..%2Finternal",
    "..%5C..",
    "x" * 1000,
]
BAD_QUERY = "after=%00&limit=%FF&conversation_id=%00%0A&x=%C0"
BAD_BODIES = [
    b"\x00",
    b"\xff\xfe",
    b"[]",
    b"5",
    b'"\\u0000"',
    b'{"reason": 5, "files": "x", "text": ["\\u0000"], "name": {}}',
    b'{"reason": "a\\u0000b", "title": "a\\u0000b", "name": "a\\u0000b"}',
    b'{"files": ["a\\u0000b"], "workspace": "a\\u0000b", "client_turn_id": "\\u0000"}',
    b'{"reason": "' + b"x" * 20_000 + b'", "title": "' + b"x" * 20_000 + b'"}',
    b"[" * 100_000,
]
_PARAM = re.compile(r"\{(\w+)(?::path)?\}")


def routes(app: FastAPI) -> list[tuple[str, str]]:
    """``(method, path template)`` of every HTTP route ``app`` publishes."""
    return [
        (method.upper(), path)
        for path, operations in app.openapi()["paths"].items()
        for method in sorted(operations)
    ]


def fill(template: str, value: str) -> str:
    """``template`` with every path parameter set to ``value``."""
    return _PARAM.sub(lambda _m: value, template)


def has_params(template: str) -> bool:
    """Whether ``template`` takes path parameters."""
    return bool(_PARAM.search(template))


def attack(base_url: str, app: FastAPI, headers: Mapping[str, str]) -> dict[str, int]:
    """Send every hostile input to every route; ``{request: status}`` of each wrong answer.

    A bad path parameter must be refused (4xx); a bad query string or body must not fail the
    server (below 500). A connection dropped without an answer raises ``ConnectionDropped``.
    """
    wrong: dict[str, int] = {}
    json_headers = {**headers, "Content-Type": "application/json"}
    for method, template in routes(app):
        if has_params(template):
            for segment in BAD_SEGMENTS:
                target = fill(template, segment)
                status = rawhttp.send(base_url, method, target, json_headers, b"{}").status
                if not 400 <= status < 500:
                    wrong[f"{method} {target}"] = status
            template = fill(template, "absent-id")
        target = f"{template}?{BAD_QUERY}"
        status = rawhttp.send(base_url, method, target, json_headers, b"{}").status
        if status >= 500:
            wrong[f"{method} {target}"] = status
        if method in ("POST", "PUT", "PATCH", "DELETE"):
            for body in BAD_BODIES:
                status = rawhttp.send(base_url, method, template, json_headers, body).status
                if status >= 500:
                    wrong[f"{method} {template} body {body[:40]!r}"] = status
    return wrong
