"""Attachments: ``POST /api/uploads`` sniffs what a file is, refuses what it must while the
body arrives, keeps each upload to its owner, and a ``user_turn`` may attach only the
sender's own uploads (a bad id refuses the turn: nothing is stored)."""

from __future__ import annotations

import socket
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from signalbox.client import Client
from signalbox.services.gateway.uploads import IMAGE_MAX_BYTES, TEXT_MAX_BYTES
from signalbox.shared.db import Turn, Upload
from tests import http_calls
from tests.gateway.conftest import LiveGateway, bearer, connect, events_until, request
from tests.rawhttp import upload as stream_upload

pytestmark = pytest.mark.anyio

Users = Callable[[], tuple[str, str]]
MiB = 1024 * 1024


def png_bytes() -> bytes:
    """A real 1x1 PNG."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00\xff\x00\x00")
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


PDF = b"%PDF-1.4\n1 0 obj << /Type /Page >> endobj\ntrailer << >>\n%%EOF\n"
FILES: list[tuple[str, bytes, str, str]] = [
    ("notes.txt", "héllo, wörld\n".encode(), "text", "text/plain"),
    ("dot.png", png_bytes(), "image", "image/png"),
    ("photo.jpg", b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + b"\x01" * 64, "image", "image/jpeg"),
    ("anim.gif", b"GIF89a\x01\x00\x01\x00" + b"\x00" * 32, "image", "image/gif"),
    ("pic.webp", b"RIFF\x24\x00\x00\x00WEBPVP8 " + b"\x00" * 32, "image", "image/webp"),
    ("paper.pdf", PDF, "pdf", "application/pdf"),
]
EXE = b"MZ\x90\x00\x03\x00\x00\x00\x04\x00" + bytes(range(256)) * 4


def _post(gw: LiveGateway, token: str, data: bytes, name: str | None = None) -> httpx.Response:
    params = {"name": name} if name is not None else {}
    return http_calls.post(
        f"{gw.url}/api/uploads",
        content=data,
        params=params,
        headers={**bearer(token), "Content-Type": "application/octet-stream"},
    )


def _uploads_of(sessions: sessionmaker[Session], user_id: str) -> int:
    with sessions() as s:
        return s.scalar(sa.select(sa.func.count()).where(Upload.user_id == user_id)) or 0


def _turns_of(sessions: sessionmaker[Session], user_id: str) -> int:
    with sessions() as s:
        return s.scalar(sa.select(sa.func.count()).where(Turn.user_id == user_id)) or 0


@pytest.mark.parametrize(("name", "data", "kind", "media_type"), FILES)
def test_each_kind_is_stored_and_read_back_as_a_download(
    gateway: LiveGateway, make_user: Users, name: str, data: bytes, kind: str, media_type: str
) -> None:
    _, token = make_user()

    created = _post(gateway, token, data, name)

    assert created.status_code == 201, created.text
    info = created.json()
    assert info["name"] == name and info["kind"] == kind and info["media_type"] == media_type
    assert info["size"] == len(data)
    meta = http_calls.get(f"{gateway.url}/api/uploads/{info['upload_id']}", headers=bearer(token))
    assert meta.json() == info
    content = http_calls.get(
        f"{gateway.url}/api/uploads/{info['upload_id']}/content", headers=bearer(token)
    )
    assert content.status_code == 200 and content.content == data
    assert content.headers["content-disposition"].startswith("attachment;")
    assert content.headers["x-content-type-options"] == "nosniff"
    assert content.headers["content-type"].split(";")[0] == media_type


def test_the_bytes_decide_the_kind_not_the_name(
    gateway: LiveGateway, make_user: Users, db_sessions: sessionmaker[Session]
) -> None:
    user_id, token = make_user()

    png_named_txt = _post(gateway, token, png_bytes(), "notes.txt")
    exe_named_png = _post(gateway, token, EXE, "cat.png")

    assert png_named_txt.status_code == 201
    assert png_named_txt.json()["kind"] == "image"
    assert png_named_txt.json()["media_type"] == "image/png"
    assert exe_named_png.status_code == 415
    assert exe_named_png.json()["code"] == "unsupported_type"
    assert _uploads_of(db_sessions, user_id) == 1


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"text with a \x00 NUL", 415),
        (b"\xc3\x28 not UTF-8", 415),
        (b"", 422),
    ],
)
def test_what_is_not_text_an_image_or_a_pdf_is_refused(
    gateway: LiveGateway,
    make_user: Users,
    db_sessions: sessionmaker[Session],
    data: bytes,
    status: int,
) -> None:
    user_id, token = make_user()

    refused = _post(gateway, token, data, "x.txt")

    assert refused.status_code == status, refused.text
    assert _uploads_of(db_sessions, user_id) == 0


def test_user_html_and_svg_are_served_as_plain_text_downloads(
    gateway: LiveGateway, make_user: Users
) -> None:
    _, token = make_user()
    svg = b'<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>'
    info = _post(gateway, token, svg, "evil.svg").json()

    served = http_calls.get(
        f"{gateway.url}/api/uploads/{info['upload_id']}/content", headers=bearer(token)
    )

    assert info["kind"] == "text"
    assert served.headers["content-type"] == "text/plain; charset=utf-8"
    assert served.headers["content-disposition"].startswith("attachment;")
    assert "sandbox" in served.headers["content-security-policy"]


def test_a_name_with_a_path_and_control_characters_is_cleaned(
    gateway: LiveGateway, make_user: Users
) -> None:
    _, token = make_user()

    info = _post(gateway, token, b"hi", "../../etc/pa\r\nss\x07wd").json()

    assert info["name"] == "passwd"


def test_another_users_upload_is_not_found_like_an_unknown_one(
    gateway: LiveGateway, make_user: Users
) -> None:
    _, token_a = make_user()
    _, token_b = make_user()
    upload_id = _post(gateway, token_a, b"secret plans", "plans.txt").json()["upload_id"]

    for path in (f"/api/uploads/{upload_id}", f"/api/uploads/{upload_id}/content"):
        theirs = http_calls.get(gateway.url + path, headers=bearer(token_b))
        unknown = http_calls.get(
            gateway.url + path.replace(upload_id, "upl_000000000000000000000000"),
            headers=bearer(token_b),
        )
        assert theirs.status_code == unknown.status_code == 404
        assert theirs.json()["code"] == unknown.json()["code"] == "not_found"
        assert b"secret" not in theirs.content


def test_an_upload_without_a_token_is_refused(gateway: LiveGateway) -> None:
    assert http_calls.post(f"{gateway.url}/api/uploads", content=b"hi").status_code == 401


# -- oversized: refused while it arrives ------------------------------------------------


def _declared_then_wait(gw: LiveGateway, token: str, head: bytes, declared: int) -> bytes:
    """Send the headers (``Content-Length: declared``) and only ``head`` of the body, then
    read the answer: a server that waited for the whole body would never answer."""
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
        sock.sendall(
            f"POST /api/uploads?name=big HTTP/1.1\r\nHost: 127.0.0.1:{gw.port}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Length: {declared}\r\n\r\n".encode()
            + head
        )
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
        return received


def test_an_image_declared_over_5_mb_is_refused_from_its_first_bytes(
    gateway: LiveGateway, make_user: Users, db_sessions: sessionmaker[Session]
) -> None:
    user_id, token = make_user()

    answer = _declared_then_wait(gateway, token, png_bytes(), IMAGE_MAX_BYTES + 1)

    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"connection: close" in answer.lower()
    assert _uploads_of(db_sessions, user_id) == 0


def test_a_body_over_the_upload_limit_is_refused_before_it_is_read(
    start_gateway: Callable[..., LiveGateway], make_user: Users
) -> None:
    gw = start_gateway(upload_max_bytes=MiB)
    _, token = make_user()

    answer = _declared_then_wait(gw, token, b"", MiB + 1)

    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"SIGNALBOX_UPLOAD_MAX_BYTES" in answer


def _kernel_buffer_max(path: str) -> int:
    """The largest a TCP socket buffer may grow to here (the last of ``tcp_rmem``/``tcp_wmem``)."""
    try:
        return int(Path(path).read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        return 64 * MiB  # unknown: assume a large one


@pytest.mark.parametrize("chunked", [True, False])
def test_a_streamed_text_over_its_limit_is_refused_part_way(
    start_gateway: Callable[..., LiveGateway],
    make_user: Users,
    db_sessions: sessionmaker[Session],
    chunked: bool,
) -> None:
    """More text than the 2 MiB text limit plus all the kernel can buffer between the two
    ends (the client's send buffer, the server's receive buffer): the answer comes while the
    client still has bytes to send, so the body was never held whole. (8 MiB were sent in
    full under load: the server's receive buffer grows to 32 MiB here, and took it all
    before the refusal.) The upload limit is raised above it, so the text limit refuses."""
    buffered = _kernel_buffer_max("/proc/sys/net/ipv4/tcp_rmem") + _kernel_buffer_max(
        "/proc/sys/net/ipv4/tcp_wmem"
    )
    total = TEXT_MAX_BYTES + buffered + 8 * MiB
    gw = start_gateway(upload_max_bytes=2 * total)
    user_id, token = make_user()

    sent = stream_upload(gw.port, "/api/uploads?name=big.txt", total, chunked, bearer(token))

    assert sent.status == 413, sent.response[:300]
    assert sent.sent < total, "the answer came only after the whole body was sent"
    assert _uploads_of(db_sessions, user_id) == 0


def test_the_other_routes_keep_the_small_body_limit(gateway: LiveGateway, make_user: Users) -> None:
    _, token = make_user()
    body = b'{"title": "' + b"x" * (2 * MiB) + b'"}'

    refused = http_calls.post(
        f"{gateway.url}/api/conversations",
        content=body,
        headers={**bearer(token), "Content-Type": "application/json"},
    )

    assert refused.status_code == 413


# -- attachments on a turn ----------------------------------------------------------------


def _conversation(gw: LiveGateway, token: str) -> str:
    created = http_calls.post(f"{gw.url}/api/conversations", json={}, headers=bearer(token))
    conversation_id: str = created.json()["conversation_id"]
    return conversation_id


async def test_a_user_turn_carries_its_attachments_to_turn_queued_and_sql(
    gateway: LiveGateway, make_user: Users, db_sessions: sessionmaker[Session]
) -> None:
    _, token = make_user()
    image = _post(gateway, token, png_bytes(), "dot.png").json()
    notes = _post(gateway, token, b"some notes", "notes.txt").json()
    ws = await connect(gateway, token)
    try:
        ack = await request(
            ws,
            {
                "type": "user_turn",
                "text": "look at these",
                "attachments": [image["upload_id"], notes["upload_id"]],
            },
        )
        assert ack["type"] == "ack", ack
        events = await events_until(ws, lambda evs: any(e["kind"] == "turn_queued" for e in evs))
    finally:
        await ws.close()

    queued = next(e for e in events if e["kind"] == "turn_queued")
    assert queued["data"]["attachments"] == [
        {
            "upload_id": image["upload_id"],
            "name": "dot.png",
            "kind": "image",
            "size": image["size"],
        },
        {"upload_id": notes["upload_id"], "name": "notes.txt", "kind": "text", "size": 10},
    ]
    with db_sessions() as s:
        turn = s.get(Turn, ack["turn_id"])
        assert turn is not None
        assert turn.attachments == [image["upload_id"], notes["upload_id"]]


async def test_another_users_upload_on_user_turn_is_an_error_and_no_turn(
    gateway: LiveGateway, make_user: Users, db_sessions: sessionmaker[Session]
) -> None:
    _, token_a = make_user()
    user_b, token_b = make_user()
    theirs = _post(gateway, token_a, b"a's file", "a.txt").json()["upload_id"]
    mine = _post(gateway, token_b, b"b's file", "b.txt").json()["upload_id"]
    ws = await connect(gateway, token_b)
    try:
        refused = await request(
            ws, {"type": "user_turn", "text": "steal it", "attachments": [mine, theirs]}
        )
    finally:
        await ws.close()

    assert refused["type"] == "error" and refused["code"] == "not_found", refused
    assert theirs in refused["message"]
    assert _turns_of(db_sessions, user_b) == 0


def test_the_http_turn_route_checks_attachments_too(
    gateway: LiveGateway, make_user: Users, db_sessions: sessionmaker[Session]
) -> None:
    _, token_a = make_user()
    user_b, token_b = make_user()
    theirs = _post(gateway, token_a, b"a's file", "a.txt").json()["upload_id"]
    mine = _post(gateway, token_b, png_bytes(), "b.png").json()["upload_id"]
    conversation_id = _conversation(gateway, token_b)
    route = f"{gateway.url}/api/conversations/{conversation_id}/turns"

    refused = http_calls.post(
        route, json={"text": "steal", "attachments": [theirs]}, headers=bearer(token_b)
    )
    twice = http_calls.post(
        route, json={"text": "twice", "attachments": [mine, mine]}, headers=bearer(token_b)
    )
    too_many = http_calls.post(
        route, json={"text": "many", "attachments": [mine] * 21}, headers=bearer(token_b)
    )
    assert (refused.status_code, refused.json()["code"]) == (404, "not_found")
    assert twice.status_code == 422 and too_many.status_code == 422
    assert _turns_of(db_sessions, user_b) == 0

    accepted = http_calls.post(
        route, json={"text": "mine", "attachments": [mine]}, headers=bearer(token_b)
    )
    assert accepted.status_code == 202, accepted.text
    with db_sessions() as s:
        turn = s.get(Turn, accepted.json()["turn_id"])
        assert turn is not None and turn.attachments == [mine]


def test_the_sdk_uploads_a_path_or_bytes_and_attaches_them(
    gateway: LiveGateway, make_user: Users, db_sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    _, token = make_user()
    path = tmp_path / "report.pdf"
    path.write_bytes(PDF)
    with Client(gateway.url, token) as client:
        from_path = client.upload(path)
        from_bytes = client.upload(png_bytes(), name="dot.png")
        conversation = client.create_conversation()
        accepted = client.start_turn(
            conversation.conversation_id,
            "read these",
            attachments=[from_path.upload_id, from_bytes.upload_id],
        )
        assert client.upload_info(from_bytes.upload_id) == from_bytes

    assert (from_path.name, from_path.kind) == ("report.pdf", "pdf")
    assert (from_bytes.name, from_bytes.kind) == ("dot.png", "image")
    with db_sessions() as s:
        turn = s.get(Turn, accepted.turn_id)
        assert turn is not None
        assert turn.attachments == [from_path.upload_id, from_bytes.upload_id]
