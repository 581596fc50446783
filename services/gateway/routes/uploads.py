"""Attachments over HTTP (``uploads.py``): upload a file, read its metadata and its bytes.

``POST /api/uploads?name=notes.txt`` takes the file as the raw request body (what
``fetch(url, {body: file})`` and ``httpx.post(url, content=...)`` send, no multipart
parsing): the one route whose body may be larger than ``SIGNALBOX_HTTP_MAX_BODY_BYTES``,
up to ``SIGNALBOX_UPLOAD_MAX_BYTES`` (``app.py`` gives it that limit in ``BodyLimit``).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response
from sqlalchemy.orm import Session

from signalbox.services.gateway import uploads
from signalbox.services.gateway.deps import CurrentUser, GatewayDep, IdPath
from signalbox.shared.gateway_api import GatewayErrorBody, UploadPublic

router = APIRouter(prefix="/api/uploads")

UPLOAD_PATH = "/api/uploads"  # app.py gives this path its own body limit

_REFUSED: dict[int | str, dict[str, Any]] = {
    413: {"model": GatewayErrorBody, "description": "larger than its kind's limit"},
    415: {"model": GatewayErrorBody, "description": "not text, an image or a PDF"},
    403: {"model": GatewayErrorBody, "description": "`quota_exceeded`: uploads or their bytes"},
    422: {"model": GatewayErrorBody, "description": "empty"},
}
_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": GatewayErrorBody, "description": "not found (another user's upload too)"},
}


def _declared_length(request: Request) -> int | None:
    value = request.headers.get("content-length", "").strip()
    return int(value) if value.isdigit() else None


@router.post("", status_code=201, response_model=UploadPublic, responses=_REFUSED)
async def upload(
    request: Request,
    user: CurrentUser,
    gateway: GatewayDep,
    name: Annotated[
        str | None,
        Query(max_length=1000, description="the file's name, shown on its chip (display only)"),
    ] = None,
) -> UploadPublic | JSONResponse:
    """Store the request body as my upload; its kind is sniffed from its bytes."""
    try:
        data, sniffed = await uploads.read_upload(
            request.stream(), _declared_length(request), gateway.settings.upload_max_bytes
        )
    except uploads.UploadTooLarge as exc:
        # The rest of the body is not read: the connection is closed instead.
        gateway.metrics.errors.labels(exc.code).inc()
        return JSONResponse(
            {"detail": exc.message, "code": exc.code}, exc.http_status, {"Connection": "close"}
        )

    def store(session: Session) -> UploadPublic:
        gateway.quotas.reserve(session, user.id, "uploads")
        gateway.quotas.reserve(session, user.id, "upload_bytes", len(data))
        return uploads.store_upload(session, user.id, name, data, sniffed)

    return await gateway.db(store)


@router.get("/{upload_id}", response_model=UploadPublic, responses=_NOT_FOUND)
async def get_upload(upload_id: IdPath, user: CurrentUser, gateway: GatewayDep) -> UploadPublic:
    """An upload's metadata (mine only)."""
    return await gateway.db(lambda s: uploads.public(uploads.owned_upload(s, user.id, upload_id)))


@router.get("/{upload_id}/content", responses=_NOT_FOUND)
async def get_content(upload_id: IdPath, user: CurrentUser, gateway: GatewayDep) -> Response:
    """An upload's bytes, always as a download and never rendered (no HTML or SVG inline)."""
    found, data = await gateway.db(lambda s: uploads.upload_content(s, user.id, upload_id))
    return Response(
        data,
        media_type=uploads.served_media_type(found.kind, found.media_type),
        headers={
            "Content-Disposition": uploads.content_disposition(found.name),
            "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": "default-src 'none'; sandbox",
            "Cache-Control": "private, no-store",
        },
    )
