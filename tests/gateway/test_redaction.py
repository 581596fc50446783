"""Tickets never reach the log: uvicorn's handshake line is rewritten."""

from __future__ import annotations

import logging

import pytest

from signalbox.services.gateway.redaction import REDACTED, RedactSecrets, install, redact


def test_redact_replaces_ticket_and_token_values() -> None:
    line = '127.0.0.1:1 - "WebSocket /ws?ticket=abc-DEF_123&x=1" [accepted]'
    assert redact(line) == f'127.0.0.1:1 - "WebSocket /ws?ticket={REDACTED}&x=1" [accepted]'
    assert redact("/x?token=s3cr3t") == f"/x?token={REDACTED}"
    assert redact("nothing here") == "nothing here"


def test_uvicorns_handshake_record_is_redacted(caplog: pytest.LogCaptureFixture) -> None:
    install()
    logger = logging.getLogger("uvicorn.error")
    assert any(isinstance(f, RedactSecrets) for f in logger.filters)
    with caplog.at_level(logging.INFO, logger="uvicorn.error"):
        # The same call uvicorn makes when it accepts a WebSocket.
        logger.info('%s - "WebSocket %s" [accepted]', "127.0.0.1:5", "/ws?ticket=SECRET123")
    assert "SECRET123" not in caplog.text
    assert f"ticket={REDACTED}" in caplog.text
