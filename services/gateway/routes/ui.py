"""The web UI: one HTML page and its script, no build step."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"

router = APIRouter()


@router.get("/", include_in_schema=False)
async def index() -> FileResponse:
    """The chat page."""
    return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})
