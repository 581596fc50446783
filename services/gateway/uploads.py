"""Attachments: files a user uploads (``POST /api/uploads``) and then names in a ``user_turn``.

What a file *is* is decided by its bytes, never by the name or content-type the client
sent: the magic bytes of PNG, JPEG, GIF, WebP and PDF, else text when the whole body is
valid UTF-8 without a NUL; anything else is refused (415). So an executable named
``.png`` is refused, and a PNG named ``.txt`` is an image.

The body is read chunk by chunk as it arrives: its kind is known from the first bytes, and
the kind's limit (the Messages API takes images up to 5 MB, PDFs up to 32 MB; text has its
own) is checked against the declared ``Content-Length`` before anything else is read, and
against the running count after each chunk. The whole file goes into SQL in one INSERT
once every check passed, so a refused upload leaves nothing behind.

An upload belongs to its user: another user's id is "not found", exactly as an unknown one.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from urllib.parse import quote

from sqlalchemy import select
from sqlalchemy.orm import Session

from signalbox.services.gateway.errors import BadInput, GatewayError, NotFound
from signalbox.shared.db import Upload
from signalbox.shared.events import Attachment, AttachmentKind
from signalbox.shared.gateway_api import UploadPublic
from signalbox.shared.ids import new_id
from signalbox.shared.timestamps import rfc3339_or_none

IMAGE_MAX_BYTES = 5 * 1024 * 1024  # the Messages API's limit of one image
PDF_MAX_BYTES = 32 * 1024 * 1024  # the Messages API's limit of one request, so of one PDF
TEXT_MAX_BYTES = 2 * 1024 * 1024  # ~500k tokens: more than any context window holds
KIND_MAX_BYTES: dict[AttachmentKind, int] = {
    "image": IMAGE_MAX_BYTES,
    "pdf": PDF_MAX_BYTES,
    "text": TEXT_MAX_BYTES,
}
SNIFF_BYTES = 12  # enough for every signature below (WebP's is the longest)
MAX_NAME_CHARS = 255
TEXT_MEDIA_TYPE = "text/plain"

_SIGNATURES: tuple[tuple[bytes, int, AttachmentKind, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", 0, "image", "image/png"),
    (b"\xff\xd8\xff", 0, "image", "image/jpeg"),
    (b"GIF87a", 0, "image", "image/gif"),
    (b"GIF89a", 0, "image", "image/gif"),
    (b"WEBP", 8, "image", "image/webp"),  # after "RIFF" and the chunk size
    (b"%PDF-", 0, "pdf", "application/pdf"),
)
_UNSAFE_NAME = re.compile(r"[\x00-\x1f\x7f/\\]")


class UploadTooLarge(GatewayError):
    """The body is over the limit of its kind (or of every upload)."""

    code = "too_large"
    http_status = 413


class UnsupportedType(GatewayError):
    """The bytes are none of the kinds an attachment may be."""

    code = "unsupported_type"
    http_status = 415


@dataclass(frozen=True)
class Sniffed:
    """What the bytes are."""

    kind: AttachmentKind
    media_type: str


def sniff(head: bytes) -> Sniffed | None:
    """The binary kind the first bytes announce, or None (text, or nothing allowed)."""
    for magic, offset, kind, media_type in _SIGNATURES:
        if head[offset : offset + len(magic)] == magic:
            if media_type == "image/webp" and not head.startswith(b"RIFF"):
                continue
            return Sniffed(kind, media_type)
    return None


def is_text(data: bytes) -> bool:
    """Valid UTF-8 with no NUL: what the model can read as a text document."""
    if b"\x00" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def clean_name(name: str | None) -> str:
    """A display name: no path, no control character, at most ``MAX_NAME_CHARS``."""
    base = (name or "").replace("\\", "/").rsplit("/", 1)[-1]
    base = unicodedata.normalize("NFC", _UNSAFE_NAME.sub("", base)).strip()
    return base[:MAX_NAME_CHARS] or "upload"


def kind_limit(kind: AttachmentKind, max_bytes: int) -> int:
    """The largest upload of ``kind``: its own limit or the deployment's, the lower."""
    return min(KIND_MAX_BYTES[kind], max_bytes)


def _too_large(kind: str, limit: int) -> UploadTooLarge:
    return UploadTooLarge(f"{kind} upload larger than {limit} bytes")


async def read_upload(
    chunks: AsyncIterator[bytes], declared: int | None, max_bytes: int
) -> tuple[bytes, Sniffed]:
    """The whole body and its kind, refused (413/415) as early as the bytes allow.

    ``declared``: the request's Content-Length, if any; ``max_bytes``: the deployment's
    ``SIGNALBOX_UPLOAD_MAX_BYTES``.
    """
    body = bytearray()
    found: Sniffed | None = None
    limit = max_bytes
    async for chunk in chunks:
        body += chunk
        if found is None and len(body) >= SNIFF_BYTES:
            found = sniff(bytes(body[:SNIFF_BYTES]))
            kind: AttachmentKind = found.kind if found else "text"
            limit = kind_limit(kind, max_bytes)
            if declared is not None and declared > limit:
                raise _too_large(kind, limit)
        if len(body) > limit:
            raise _too_large(found.kind if found else "text", limit)
    data = bytes(body)
    if found is None:
        found = sniff(data)
    if found is None:
        if not data:
            raise BadInput("the upload is empty")
        if not is_text(data):
            raise UnsupportedType(
                "not an image (PNG, JPEG, GIF, WebP), a PDF or UTF-8 text without NUL bytes"
            )
        found = Sniffed("text", TEXT_MEDIA_TYPE)
    limit = kind_limit(found.kind, max_bytes)
    if len(data) > limit:
        raise _too_large(found.kind, limit)
    return data, found


def public(upload: Upload) -> UploadPublic:
    """The metadata the API shows of ``upload``."""
    return UploadPublic(
        upload_id=upload.id,
        name=upload.name,
        kind=upload.kind,
        media_type=upload.media_type,
        size=upload.size,
        sha256=upload.sha256,
        created_at=rfc3339_or_none(upload.created_at),
    )


def store_upload(
    session: Session, user_id: str, name: str | None, data: bytes, sniffed: Sniffed
) -> UploadPublic:
    """Insert the checked upload (one row, bytes included) and return its metadata."""
    upload = Upload(
        id=new_id("upl"),
        user_id=user_id,
        name=clean_name(name),
        kind=sniffed.kind,
        media_type=sniffed.media_type,
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        data=data,
    )
    session.add(upload)
    session.flush()
    return public(upload)


def owned_upload(session: Session, user_id: str, upload_id: str) -> Upload:
    """``upload_id`` if it is ``user_id``'s; another user's is NotFound like an unknown one."""
    upload = session.get(Upload, upload_id)
    if upload is None or upload.user_id != user_id:
        raise NotFound(f"no such upload: {upload_id!r}")
    return upload


def upload_content(session: Session, user_id: str, upload_id: str) -> tuple[UploadPublic, bytes]:
    """An owned upload's metadata and its bytes."""
    upload = owned_upload(session, user_id, upload_id)
    return public(upload), upload.data


def owned_attachments(
    session: Session, user_id: str, upload_ids: Sequence[str] | None
) -> list[Attachment]:
    """The chips of ``upload_ids`` in order, each checked to be ``user_id``'s own.

    Called in the transaction that stores the turn, before it: a bad id refuses the turn.
    """
    if not upload_ids:
        return []
    if len(set(upload_ids)) != len(upload_ids):
        raise BadInput("attachments: the same upload is attached twice")
    rows = session.scalars(
        select(Upload).where(Upload.id.in_(list(upload_ids)), Upload.user_id == user_id)
    ).all()
    by_id = {row.id: row for row in rows}
    missing = [i for i in upload_ids if i not in by_id]
    if missing:
        raise NotFound(f"attachments: no such upload: {missing[0]!r}")
    return [
        Attachment.model_validate(
            {"upload_id": u.id, "name": u.name, "kind": u.kind, "size": u.size}
        )
        for u in (by_id[i] for i in upload_ids)
    ]


def content_disposition(name: str) -> str:
    """``attachment`` with the name, ASCII-safe and in RFC 5987 form: never shown inline."""

    ascii_name = name.encode("ascii", "replace").decode().replace('"', "_").replace("?", "_")
    return f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(name, safe='')}"


def served_media_type(kind: str, media_type: str) -> str:
    """The Content-Type of the bytes: sniffed, so never HTML or SVG (those are text/plain)."""
    return "text/plain; charset=utf-8" if kind == "text" else media_type
