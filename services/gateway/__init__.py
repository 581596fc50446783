"""The gateway: WebSocket/SSE sessions, auth, HTTP API and the web UI (FastAPI on uvicorn)."""
