"""The UI's own routes: the page's headers, /docs and /redoc offline, /api/me, /api/activity."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from tests import http_calls
from tests.gateway.conftest import LiveGateway, add_call, add_turn, bearer

Users = Callable[[], tuple[str, str]]


def test_the_page_forbids_inline_script(gateway: LiveGateway) -> None:
    page = http_calls.get(f"{gateway.url}/")
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "'unsafe-inline'" not in csp
    assert "default-src 'self'" in csp and "object-src 'none'" in csp
    assert page.headers["x-content-type-options"] == "nosniff"


def test_docs_and_redoc_load_their_assets_from_the_gateway(gateway: LiveGateway) -> None:
    for path, asset in [
        ("/docs", "/static/vendor/swagger-ui-bundle.js"),
        ("/docs", "/static/vendor/swagger-ui.css"),
        ("/redoc", "/static/vendor/redoc.standalone.js"),
    ]:
        html = http_calls.get(f"{gateway.url}{path}").text
        assert asset in html
        assert "cdn.jsdelivr" not in html and "fonts.googleapis" not in html
        assert http_calls.get(f"{gateway.url}{asset}").status_code == 200
    assert "/api/me" in http_calls.get(f"{gateway.url}/openapi.json", timeout=60).json()["paths"]


def test_me_names_the_token_user_and_401s_a_wrong_token(
    gateway: LiveGateway, make_user: Users
) -> None:
    user_id, token = make_user()
    me = http_calls.get(f"{gateway.url}/api/me", headers=bearer(token))
    assert me.status_code == 200
    assert me.json()["user_id"] == user_id and me.json()["name"].startswith("user-")
    assert http_calls.get(f"{gateway.url}/api/me", headers=bearer("sbt_nope")).status_code == 401


def test_activity_counts_what_waits_and_the_running_root_turn(
    gateway: LiveGateway,
    make_user: Users,
    conversation_of: Callable[[str], str],
    db_sessions: sessionmaker[Session],
) -> None:
    user_id, token = make_user()
    other_id, _ = make_user()
    quiet, busy = conversation_of(user_id), conversation_of(user_id)
    theirs = conversation_of(other_id)
    turn_id = add_turn(db_sessions, user_id, busy, "parked")
    add_call(db_sessions, turn_id, busy)  # a decision waiting
    add_call(db_sessions, turn_id, busy, tool="ask_user", status="waiting", seq=2)
    add_turn(db_sessions, user_id, busy, "running", parent_call_id="call_x")  # a sub-agent

    rows = http_calls.get(f"{gateway.url}/api/activity", headers=bearer(token)).json()[
        "conversations"
    ]
    by_id = {r["conversation_id"]: r for r in rows}
    assert set(by_id) == {quiet, busy}, "only mine"
    assert rows[0]["conversation_id"] == busy, "most recently active first"
    assert by_id[busy]["active_turn_id"] == turn_id
    assert (by_id[busy]["waiting_decisions"], by_id[busy]["waiting_questions"]) == (1, 1)
    assert by_id[quiet]["active_turn_id"] is None
    assert (by_id[quiet]["waiting_decisions"], by_id[quiet]["waiting_questions"]) == (0, 0)
    assert theirs not in by_id
