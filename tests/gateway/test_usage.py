"""``GET /api/usage`` and ``GET /api/conversations/{id}/usage``: the caller's own model
requests, summed in tokens and dollars, grouped on request; nobody else's."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from signalbox.shared.db import ModelRequest
from tests import http_calls
from tests.gateway.conftest import LiveGateway, bearer

Users = Callable[[], tuple[str, str]]


def _request(
    user_id: str,
    conversation_id: str,
    turn_id: str,
    purpose: str = "step",
    cost: float | None = 0.01,
    model: str = "claude-sonnet-5-5",
) -> ModelRequest:
    return ModelRequest(
        user_id=user_id,
        conversation_id=conversation_id,
        turn_id=turn_id if purpose == "step" else f"{turn_id}-child",
        root_turn_id=turn_id,
        purpose=purpose,
        model=model,
        input_tokens=10,
        output_tokens=5,
        cache_creation_input_tokens=100,
        cache_read_input_tokens=1000,
        cost_usd=cost,
    )


def test_usage_sums_my_requests_by_conversation_turn_and_purpose(
    gateway: LiveGateway,
    make_user: Users,
    conversation_of: Callable[[str], str],
    db_sessions: sessionmaker[Session],
) -> None:
    user_id, token = make_user()
    other_id, other_token = make_user()
    first, second, others = (
        conversation_of(user_id),
        conversation_of(user_id),
        conversation_of(other_id),
    )
    with db_sessions() as s, s.begin():
        s.add_all(
            [
                _request(user_id, first, "turn_a"),
                _request(user_id, first, "turn_a", purpose="sub_agent"),
                _request(user_id, second, "turn_b", cost=None, model="some-unpriced-model"),
                _request(other_id, others, "turn_c"),
            ]
        )

    mine = http_calls.get(f"{gateway.url}/api/usage", headers=bearer(token)).json()
    assert mine["total"] == {
        "key": None,
        "requests": 3,
        "input_tokens": 30,
        "output_tokens": 15,
        "cache_creation_input_tokens": 300,
        "cache_read_input_tokens": 3000,
        "cost_usd": 0.02,
        "unpriced_requests": 1,
    }
    assert mine["groups"] == []
    by_conversation = http_calls.get(
        f"{gateway.url}/api/usage", params={"group_by": "conversation"}, headers=bearer(token)
    ).json()
    assert [(g["key"], g["requests"], g["cost_usd"]) for g in by_conversation["groups"]] == [
        (first, 2, 0.02),
        (second, 1, 0.0),
    ]

    url = f"{gateway.url}/api/conversations/{first}/usage"
    by_purpose = http_calls.get(url, params={"group_by": "purpose"}, headers=bearer(token)).json()
    assert by_purpose["conversation_id"] == first and by_purpose["total"]["requests"] == 2
    assert sorted(g["key"] for g in by_purpose["groups"]) == ["step", "sub_agent"]
    by_turn = http_calls.get(url, params={"group_by": "turn"}, headers=bearer(token)).json()
    assert [(g["key"], g["requests"]) for g in by_turn["groups"]] == [("turn_a", 2)]

    assert http_calls.get(url, headers=bearer(other_token)).status_code == 404
    theirs = http_calls.get(f"{gateway.url}/api/usage", headers=bearer(other_token)).json()
    assert theirs["total"]["requests"] == 1
    bad_group = http_calls.get(url, params={"group_by": "user"}, headers=bearer(token))
    assert bad_group.status_code == 422
    bad_id = http_calls.get(f"{gateway.url}/api/conversations/a..b/usage", headers=bearer(token))
    assert bad_id.status_code == 422
    assert http_calls.get(f"{gateway.url}/api/usage").status_code == 401
