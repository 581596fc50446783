"""``signalbox webhooks`` through ``main()`` against a real gateway (the SDK over real HTTP):
create prints the secret once, list and show the deliveries, delete removes; refusals exit 1."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy.orm import Session, sessionmaker

from signalbox.cli import main
from signalbox.shared.db.webhooks import enqueue
from tests.orchestrator.support import wait_for

from .conftest import LiveGateway
from .test_webhooks import Receiver


def test_webhooks_cli_creates_lists_shows_and_deletes_and_refusals_exit_1(
    start_gateway: Callable[..., LiveGateway],
    make_user: Callable[[], tuple[str, str]],
    db_sessions: sessionmaker[Session],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    receiver = Receiver(failures=0).start()
    try:
        gateway = start_gateway(webhook_allow_private=True, webhook_poll_s=0.05)
        user_id, token = make_user()
        monkeypatch.setenv("SIGNALBOX_TOKEN", token)

        def cli(*args: str) -> tuple[int, str, str]:
            code = main(["webhooks", *args, "--url", gateway.url])
            out, err = capsys.readouterr()
            return code, out, err

        code, out, _ = cli("list")
        assert code == 0 and out.startswith("no webhooks")

        code, out, _ = cli("create", receiver.url, "--kinds", "turn_finished,proposal_created")
        assert code == 0, out
        [line, secret_line] = out.strip().splitlines()
        webhook_id = line.split()[0]
        assert webhook_id.startswith("wh_") and receiver.url in line
        assert "[proposal_created,turn_finished]" in line and "no deliveries yet" in line
        assert secret_line.startswith("secret: whsec_")

        # An event of mine: the deliverer sends it, and list/show report it.
        with db_sessions() as s, s.begin():
            assert enqueue(s, user_id, "conv_x", "proposal_created", {"proposal_id": "p1"}) == 1
        wait_for(lambda: len(receiver.requests) == 1, timeout_s=10, what="the delivery")

        def listed() -> str:
            code, out, _ = cli("list")
            assert code == 0
            return out

        wait_for(lambda: "delivered" in listed(), timeout_s=10, what="the list to show it")
        assert "delivered after 1 attempt(s) HTTP 200: proposal_created" in listed()
        code, out, _ = cli("show", webhook_id)
        assert code == 0 and "proposal_created:p1" in out
        assert "whsec_" not in out  # the secret is shown at creation only

        code, _, err = cli("create", receiver.url, "--kinds", "text_delta")
        assert code == 1 and "422" in err
        code, _, err = cli("create", "file:///etc/passwd", "--kinds", "turn_finished")
        assert code == 1 and "http or https" in err

        code, out, _ = cli("delete", webhook_id)
        assert code == 0 and out.startswith(f"deleted {webhook_id}")
        code, _, err = cli("show", webhook_id)
        assert code == 1 and "not found" in err
        code, out, _ = cli("list")
        assert out.startswith("no webhooks")
    finally:
        receiver.stop()
