"""One logging setup: the two formats, the ids of a turn on every line, no secret in any.

The Celery hop is crossed by a real worker process (threads and prefork pools) on the
test's Redis, as the orchestrator and the tool workers cross it.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from signalbox.processes import Child, child_env, log_contains
from signalbox.services.orchestrator.anthropic_model import AnthropicModel
from signalbox.services.orchestrator.model import ModelRequest
from signalbox.shared.celery_app import make_celery
from signalbox.shared.log_config import configure_logging
from signalbox.shared.log_context import (
    CONTEXT_HEADER,
    bind_log_context,
    current_context,
    log_context,
)
from signalbox.shared.redaction import _PATTERNS, REDACTED, redact
from signalbox.shared.settings import CommonSettings
from tests.fake_anthropic import FakeAnthropic, reply, text
from tests.shared.log_hop_app import HOP_QUEUE, REPORT_TASK

RESULT_TIMEOUT_S = 30.0
RFC3339_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
INTERNAL_TOKEN = "internal-" + "k" * 32
API_KEY = "sk-ant-api03-" + "a" * 40


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    """``configure_logging`` writing to a buffer; the root logger restored afterwards."""
    monkeypatch.setenv("SIGNALBOX_INTERNAL_TOKEN", INTERNAL_TOKEN)
    monkeypatch.setenv("ANTHROPIC_API_KEY", API_KEY)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    buffer = io.StringIO()
    yield buffer
    root.handlers[:] = handlers
    root.setLevel(level)


def _json_lines(buffer: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in buffer.getvalue().splitlines()]


def test_json_lines_carry_the_fields_and_the_ids_of_the_context(captured: io.StringIO) -> None:
    configure_logging("gateway", "INFO", "json", stream=captured)
    log = logging.getLogger("signalbox.test")
    with log_context(conversation_id="conv_1", turn_id="turn_1", user_id="user_1"):
        log.info("turn %s queued", "turn_1")
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("it failed")
    log.info("outside")
    log.debug("below the level")

    first, failed, outside = _json_lines(captured)
    assert RFC3339_UTC.match(first["ts"]), first["ts"]
    assert first["level"] == "INFO" and first["logger"] == "signalbox.test"
    assert first["service"] == "gateway"
    assert first["message"] == "turn turn_1 queued"
    assert (first["conversation_id"], first["turn_id"], first["user_id"]) == (
        "conv_1",
        "turn_1",
        "user_1",
    )
    assert "call_id" not in first
    assert failed["level"] == "ERROR"
    assert "ValueError: boom" in failed["exc_info"] and "Traceback" in failed["exc_info"]
    assert "turn_id" not in outside, "the context outlived its block"


def test_human_lines_show_time_level_service_logger_and_ids(captured: io.StringIO) -> None:
    configure_logging("tools", "INFO", "human", stream=captured)
    with log_context(turn_id="turn_2", call_id="call_2"):
        logging.getLogger("signalbox.services.tools").warning("slow call")
    (line,) = captured.getvalue().splitlines()
    stamp, level, service, logger, rest = line.split(" ", 4)
    assert RFC3339_UTC.match(stamp)
    assert (level, service, logger) == ("WARNING", "tools", "signalbox.services.tools:")
    assert rest == "slow call turn_id=turn_2 call_id=call_2"


def test_the_level_comes_from_the_environment(
    captured: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SIGNALBOX_LOG_LEVEL", "warning")
    monkeypatch.setenv("SIGNALBOX_LOG_FORMAT", "json")
    configure_logging("proposals", stream=captured)
    logging.getLogger("x").info("hidden")
    logging.getLogger("x").warning("shown")
    assert [e["message"] for e in _json_lines(captured)] == ["shown"]
    with pytest.raises(ValueError, match="SIGNALBOX_LOG_LEVEL"):
        configure_logging("proposals", "LOUD", stream=captured)
    with pytest.raises(ValueError, match="SIGNALBOX_LOG_FORMAT"):
        configure_logging("proposals", "INFO", "xml", stream=captured)


def test_the_model_clients_request_lines_show_at_debug_only(
    captured: io.StringIO, fake_anthropic: FakeAnthropic
) -> None:
    # The anthropic SDK's HTTP client (httpx2) logs a line per request at INFO: one per
    # model step, every step of every turn.
    fake_anthropic.script([reply(text("one")), reply(text("two"))])
    model = AnthropicModel("sk-test", fake_anthropic.url, "claude-test", retry_backoff_s=0)
    request = ModelRequest(system="", messages=[{"role": "user", "content": "hi"}])
    quiet = {name: logging.getLogger(name).level for name in ("httpx2", "httpcore2")}
    try:
        configure_logging("orchestrator", "INFO", "json", stream=captured)
        list(model.stream(request))
        assert not [e for e in _json_lines(captured) if e["logger"].startswith("httpx")]
        configure_logging("orchestrator", "DEBUG", "json", stream=captured)
        list(model.stream(request))
        assert any(
            e["logger"] == "httpx2" and "HTTP Request" in e["message"]
            for e in _json_lines(captured)
        )
    finally:
        for name, level in quiet.items():
            logging.getLogger(name).setLevel(level)


def test_a_second_configuration_replaces_the_first(captured: io.StringIO) -> None:
    configure_logging("cli", "INFO", "json", stream=captured)
    configure_logging("cli", "INFO", "json", stream=captured)
    logging.getLogger("x").info("once")
    assert len(_json_lines(captured)) == 1


def test_no_secret_reaches_a_line(captured: io.StringIO) -> None:
    """What a careless log call would print: every secret is gone, in both formats."""
    user_token = "sbt_" + "u" * 43
    ticket = "T1cket-" + "t" * 36
    webhook_secret = "whsec_" + "f" * 48
    db_password = "pg-Pa55word-xyz"
    for fmt in ("json", "human"):
        buffer = io.StringIO()
        configure_logging("gateway", "INFO", fmt, stream=buffer)
        # uvicorn's handshake line; a logger of the test's own (an in-process uvicorn of another
        # test may have set uvicorn's loggers' levels).
        log = logging.getLogger("signalbox.test.secrets")
        log.info('%s - "WebSocket %s" [accepted]', "127.0.0.1:5", f"/ws?ticket={ticket}")
        log.info("GET /api/events?token=%s&after=1", user_token)
        log.info("headers: %r", {"Authorization": f"Bearer {user_token}", "x-api-key": API_KEY})
        log.info("X-Signalbox-Internal-Token: %s", INTERNAL_TOKEN)
        log.info("the key is %s and the token %s", API_KEY, INTERNAL_TOKEN)
        log.info("webhook %s signed", webhook_secret)
        log.info("database at postgresql://signalbox:%s@postgres/signalbox", db_password)
        try:
            raise RuntimeError(f"request with {user_token} failed")
        except RuntimeError:
            log.exception("upstream")
        text = buffer.getvalue()
        for secret in (user_token, ticket, webhook_secret, db_password, API_KEY, INTERNAL_TOKEN):
            assert secret not in text, f"{fmt}: {secret!r} in the log"
        assert text.count(REDACTED) >= 9, text
        assert "Bearer [redacted]" in text
        if fmt == "json":
            assert len(_json_lines(buffer)) == 8  # the traceback stays inside its line


def test_redact_leaves_ordinary_text_alone() -> None:
    line = "turn turn_abc: 3 tool calls, max_tokens=4096, tokens 1200 in / 80 out"
    assert redact(line) == line


@pytest.mark.parametrize(
    "line",
    [
        "GET /ws?TICKET=abc123&x=1",
        "/x?Token=s3cr3t /y?SECRET=a /z?PassWord=b",
        "{'AUTHORIZATION': 'Basic dXNlcjpwdw=='}",
        "X-Api-Key = sk-ant-" + "k" * 20,
        "x-signalbox-internal-token: " + "i" * 30,
        "webhook whsec_" + "w" * 20 + " and sbt_" + "u" * 20,
        "REDIS://user:pw@host:6379/0 and Postgresql://:pw@db/x",
        "a \u017fecret=x (a long s) and a tic\u212aet=y (a Kelvin sign)",
        "t\u0130cket=abcdef123 and Author\u0131zation: Bearer abcdefgh (dotted, dotless I)",
        "x-s\u0130gnalbox-internal-token: " + "i" * 30,
        "call call_abc: count_quick ok in 3 ms",
    ],
)
def test_redact_rewrites_what_every_pattern_would_without_its_prefilter(line: str) -> None:
    """Lines are searched only when they hold one of a pattern's words: the same result as
    searching every line with every pattern, whatever the letters' case."""
    expected = line
    for pattern, replacement, _words in _PATTERNS:
        expected = pattern.sub(replacement, expected)
    assert redact(line) == expected


def test_context_fields_are_known_names_and_nest() -> None:
    with pytest.raises(TypeError, match="session_id"), log_context(session_id="s"):
        pass
    with log_context(turn_id="t1", user_id="u1"):
        with log_context(call_id="c1", user_id=None):
            bind_log_context(conversation_id="conv")
            assert current_context() == {
                "turn_id": "t1",
                "user_id": "u1",
                "call_id": "c1",
                "conversation_id": "conv",
            }
        assert current_context() == {"turn_id": "t1", "user_id": "u1"}
    assert current_context() == {}


# --- across a Celery hop, through a real worker process ---


@pytest.fixture(scope="module")
def hop_settings(redis_url: str, redis_prefix: str) -> dict[str, str]:
    return {
        "SIGNALBOX_REDIS_URL": redis_url,
        "SIGNALBOX_REDIS_PREFIX": f"{redis_prefix}loghop-{uuid.uuid4().hex[:6]}:",
        "SIGNALBOX_LOG_FORMAT": "json",
        "SIGNALBOX_LOG_LEVEL": "INFO",
    }


@pytest.fixture(scope="module")
def sender(hop_settings: dict[str, str]) -> Iterator[Celery]:
    settings = CommonSettings(
        redis_url=hop_settings["SIGNALBOX_REDIS_URL"],
        redis_prefix=hop_settings["SIGNALBOX_REDIS_PREFIX"],
    )
    app = make_celery("signalbox-loghop-sender", settings)
    yield app
    app.close()


@pytest.fixture(scope="module", params=["threads", "prefork"])
def hop_worker(
    request: pytest.FixtureRequest,
    hop_settings: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Child]:
    pool = str(request.param)
    child = Child(
        name=f"loghop-{pool}",
        args=[
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.shared.log_hop_app:app",
            "worker",
            "-Q",
            HOP_QUEUE,
            "--pool",
            pool,
            "-c",
            "1",
            "-n",
            f"loghop-{pool}@%h",
            "--without-gossip",
            "--without-mingle",
            "-E",
        ],
        log_path=tmp_path_factory.mktemp("loghop") / f"{pool}.log",
        env=child_env(os.environ, {**hop_settings, "PYTHONPATH": str(Path.cwd())}),
    )
    child.start()
    try:
        child.wait_ready(log_contains(child, " ready."))
        yield child
    finally:
        child.stop()


def _worker_lines(child: Child) -> list[dict[str, Any]]:
    text = child.log_path.read_text()[child.log_start :]
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_the_ids_cross_two_celery_hops_and_end_with_the_task(
    hop_worker: Child, sender: Celery
) -> None:
    with log_context(conversation_id="conv_hop", turn_id="turn_hop", user_id="user_hop"):
        first = sender.send_task(REPORT_TASK, args=[1, "call_hop"], queue=HOP_QUEUE)
    following = first.get(timeout=RESULT_TIMEOUT_S)["next"]
    ids = sender.AsyncResult(following).get(timeout=RESULT_TIMEOUT_S)
    assert ids == {
        "conversation_id": "conv_hop",
        "turn_id": "turn_hop",
        "user_id": "user_hop",
        "call_id": "call_hop",
    }
    # The same pool thread or process, a task sent with no ids: none are left over.
    assert sender.send_task(REPORT_TASK, queue=HOP_QUEUE).get(timeout=RESULT_TIMEOUT_S) == {}

    lines = _worker_lines(hop_worker)  # every line JSON (json.loads raised otherwise)
    reports = [e for e in lines if e["message"].startswith("report:")]
    assert [e.get("turn_id") for e in reports] == ["turn_hop", "turn_hop", None]
    assert [e.get("call_id") for e in reports] == [None, "call_hop", None]
    assert all(e["service"] == "loghop" for e in lines)
    # Celery's own line for the task is written inside it too.
    succeeded = [e for e in lines if first.id in e["message"] and "succeeded" in e["message"]]
    assert succeeded and succeeded[0]["turn_id"] == "turn_hop"


def test_a_header_from_elsewhere_adds_only_known_ids(hop_worker: Child, sender: Celery) -> None:
    forged = {"turn_id": "t" * 500, "password": "x", "call_id": 7}
    result = sender.send_task(REPORT_TASK, queue=HOP_QUEUE, headers={CONTEXT_HEADER: forged})
    assert result.get(timeout=RESULT_TIMEOUT_S) == {"turn_id": "t" * 100}
