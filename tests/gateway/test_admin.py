"""The admin role: every admin route refuses a normal user (written as the attack, on every
route the admin router has, so a route added later is attacked too), and does its work for
an admin."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fastapi.routing import APIRoute
from sqlalchemy.orm import Session, sessionmaker

from signalbox.services.gateway.routes.admin import router as admin_router
from signalbox.shared.db import User, UserLimits
from tests import http_calls
from tests.gateway.conftest import LiveGateway, bearer


def _make_admin(sessions: sessionmaker[Session], user_id: str) -> None:
    with sessions() as s, s.begin():
        user = s.get(User, user_id)
        assert user is not None
        user.is_admin = True


BODIES = {"PUT": {"day_tokens": 1}, "POST": {}}


def test_a_normal_user_calling_each_admin_route_is_refused_403_and_changes_nothing(
    gateway: LiveGateway,
    make_user: Callable[[], tuple[str, str]],
    db_sessions: sessionmaker[Session],
) -> None:
    victim_id, victim_token = make_user()
    _make_admin(db_sessions, victim_id)
    _attacker_id, attacker_token = make_user()
    routes = [r for r in admin_router.routes if isinstance(r, APIRoute)]
    assert len(routes) >= 6
    with http_calls.Client(base_url=gateway.url, headers=bearer(attacker_token)) as http:
        for route in routes:
            path = route.path.replace("{user_id}", victim_id)
            for method in route.methods or set():
                body = {"conversations": 0} if path.endswith("/quotas") else BODIES.get(method)
                reply = http.request(method, path, json=body)
                assert reply.status_code == 403, (method, path, reply.text)
                assert reply.json()["code"] == "forbidden"
    with db_sessions() as s:
        assert s.get(UserLimits, victim_id) is None, "no budget or quota was written"
    with http_calls.Client(base_url=gateway.url, headers=bearer(victim_token)) as http:
        assert http.get("/api/me").status_code == 200, "the victim's token was not revoked"
    with http_calls.Client(base_url=gateway.url) as anonymous:
        assert anonymous.get("/api/admin/usage").status_code == 401


def test_an_admin_sees_every_users_usage_sets_budgets_and_quotas_and_revokes_tokens(
    gateway: LiveGateway,
    make_user: Callable[[], tuple[str, str]],
    db_sessions: sessionmaker[Session],
) -> None:
    admin_id, admin_token = make_user()
    _make_admin(db_sessions, admin_id)
    user_id, user_token = make_user()
    with http_calls.Client(base_url=gateway.url, headers=bearer(admin_token)) as http:
        assert http.get("/api/me").json()["is_admin"] is True
        usage = http.get("/api/admin/usage").json()
        assert {admin_id, user_id} <= {row["user_id"] for row in usage}

        budget = http.put(f"/api/admin/users/{user_id}/budget", json={"month_tokens": 1000})
        assert budget.status_code == 200, budget.text
        [month] = budget.json()["budgets"]
        assert (month["period"], month["limit_tokens"], month["used_tokens"]) == ("month", 1000, 0)

        quotas = http.put(f"/api/admin/users/{user_id}/quotas", json={"conversations": 1})
        assert quotas.status_code == 200, quotas.text
        limits = {q["name"]: q["limit"] for q in quotas.json()["quotas"]}
        assert limits["conversations"] == 1

        assert http.put("/api/admin/users/user_nobody/budget", json={}).status_code == 404
        bad = http.put(f"/api/admin/users/{user_id}/budget", json={"day_tokens": -1})
        assert bad.status_code == 422

        with http_calls.Client(base_url=gateway.url, headers=bearer(user_token)) as user_http:
            [mine] = user_http.get("/api/me/budget").json()["budgets"]
            assert mine["limit_tokens"] == 1000
            revoked = http.post(f"/api/admin/users/{user_id}/revoke-tokens")
            assert revoked.json() == {"user_id": user_id, "revoked": 1}
            assert user_http.get("/api/me").status_code == 401


@pytest.mark.parametrize("path", ["/api/me/budget", "/api/me/quotas"])
def test_a_user_sees_only_their_own_budget_and_quotas(
    gateway: LiveGateway, make_user: Callable[[], tuple[str, str]], path: str
) -> None:
    user_id, token = make_user()
    with http_calls.Client(base_url=gateway.url, headers=bearer(token)) as http:
        reply = http.get(path, params={"user_id": "user_someone_else"})
    assert reply.status_code == 200
    assert reply.json()["user_id"] == user_id


def test_an_admin_sets_a_users_fair_share(
    gateway: LiveGateway,
    make_user: Callable[[], tuple[str, str]],
    db_sessions: sessionmaker[Session],
) -> None:
    admin_id, admin_token = make_user()
    _make_admin(db_sessions, admin_id)
    user_id, _token = make_user()
    with http_calls.Client(base_url=gateway.url, headers=bearer(admin_token)) as http:
        before = http.get(f"/api/admin/users/{user_id}/share")
        assert before.status_code == 200, before.text
        assert before.json()["max_running_turns"] is None
        assert before.json()["effective_max_running_turns"] == 4  # the deployment's default
        changed = http.put(
            f"/api/admin/users/{user_id}/share", json={"max_running_turns": 1, "weight": 3}
        )
        assert changed.status_code == 200, changed.text
        assert changed.json() == {
            "user_id": user_id,
            "max_running_turns": 1,
            "weight": 3,
            "effective_max_running_turns": 1,
            "running": 0,
            "waiting": 0,
        }
        bad = http.put(f"/api/admin/users/{user_id}/share", json={"weight": 0})
        assert bad.status_code == 422
        assert http.get("/api/admin/users/user_nobody/share").status_code == 404
    with db_sessions() as s:
        limits = s.get(UserLimits, user_id)
        assert limits is not None and (limits.max_running_turns, limits.weight) == (1, 3)
