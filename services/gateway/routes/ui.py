"""The web UI (one HTML page and its ES modules, no build step) and the API docs pages.

The page is served with a Content-Security-Policy that allows scripts and styles from the
gateway only: model output rendered into the page can never run inline script, and
``/docs`` and ``/redoc`` load their vendored assets from ``/static/vendor`` (they work
offline).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
VENDOR = "/static/vendor"

# No inline script, no eval, nothing from another origin; 'self' covers the page's own
# ws:// or wss:// socket. Images may be data: URLs (Markdown images from elsewhere are not
# fetched).
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
UI_HEADERS = {
    "Cache-Control": "no-cache",
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

router = APIRouter()


@router.get("/", include_in_schema=False)
async def index() -> FileResponse:
    """The chat page."""
    return FileResponse(STATIC_DIR / "index.html", headers=UI_HEADERS)


@router.get("/docs", include_in_schema=False)
async def swagger_ui(request: Request) -> HTMLResponse:
    """Swagger UI for the gateway's OpenAPI, from vendored assets."""
    return get_swagger_ui_html(
        openapi_url=request.app.openapi_url or "/openapi.json",
        title="Signalbox gateway - API",
        swagger_js_url=f"{VENDOR}/swagger-ui-bundle.js",
        swagger_css_url=f"{VENDOR}/swagger-ui.css",
        swagger_favicon_url="data:,",
    )


@router.get("/redoc", include_in_schema=False)
async def redoc(request: Request) -> HTMLResponse:
    """ReDoc for the gateway's OpenAPI, from vendored assets."""
    return get_redoc_html(
        openapi_url=request.app.openapi_url or "/openapi.json",
        title="Signalbox gateway - API",
        redoc_js_url=f"{VENDOR}/redoc.standalone.js",
        redoc_favicon_url="data:,",
        with_google_fonts=False,
    )
