"""The proposals service refuses an oversized body while it arrives, as the gateway does
(issue 12, finding 6): its callers hold the internal token, but what a tool worker sends it
is the model's, so a 50 MB proposal must not be buffered whole either."""

from __future__ import annotations

import pytest

from tests.proposals.conftest import StartService
from tests.rawhttp import upload

MiB = 1024 * 1024
LIMIT_BYTES = MiB
ATTACK_BYTES = 50 * MiB
MAX_SENT_BYTES = 8 * MiB  # what loopback socket buffers take in before the answer is read


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_an_oversized_proposal_is_refused_413_before_it_is_read(
    start_service: StartService, internal_token: str, chunked: bool
) -> None:
    service = start_service(SIGNALBOX_PROPOSALS_MAX_BODY_BYTES=str(LIMIT_BYTES))
    port = int(service.base_url.rsplit(":", 1)[1])
    headers = {"X-Signalbox-Internal-Token": internal_token}

    answer = upload(port, "/internal/proposals", ATTACK_BYTES, chunked, headers)

    assert answer.status == 413, answer.response[:300]
    assert b"SIGNALBOX_PROPOSALS_MAX_BODY_BYTES" in answer.response
    assert answer.sent < MAX_SENT_BYTES  # answered long before the end
