"""Fair scheduling with every service a real process: one user's flood of turns does not
delay another user's turn beyond their fair share (shared/admission.py).

User A sends 100 turns at once, in 100 conversations; a second later user B sends one.
The model (the fake Messages API) takes 0.3 s per answer, so A's turns keep the
orchestrator busy for seconds. Of A's turns still waiting when B's was stored, fewer than
half may start before B's (only those refilling A's share of slots while B's starts): in
a first-come queue every one of them would. Every one of A's turns must complete, never
more than A's share at once. The test asserts order, not time (CI's load moves times 10x);
it prints how long B's start took alone and under the flood.
"""

from __future__ import annotations

import asyncio
import statistics
import uuid
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from signalbox.processes import wait_until
from signalbox.shared.db import Turn
from signalbox.shared.db.models import as_utc
from signalbox.shared.db.users import create_user
from signalbox.shared.statuses import TurnState
from signalbox.stack import Stack, StackConfig
from tests import http_calls
from tests.fake_anthropic import FakeAnthropic, stall, text

ANSWER_S = 0.3  # the model's time per answer
FLOOD = 100  # user A's turns, sent at once
PER_USER = 4  # turns of one user running at once (the deployment's default)


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as server:
        yield server


@pytest.fixture(scope="module")
def fair_stack(
    tmp_path_factory: pytest.TempPathFactory,
    redis_url: str,
    redis_prefix: str,
    stack_database_url: str,
    internal_token: str,
    fake: FakeAnthropic,
) -> Iterator[Stack]:
    config = StackConfig(
        var_dir=tmp_path_factory.mktemp("fair"),
        redis_url=redis_url,
        database_url=stack_database_url,
        internal_token=internal_token,
        redis_prefix=f"{redis_prefix}fair-{uuid.uuid4().hex[:6]}:",
        extra_env={
            "ANTHROPIC_API_KEY": "test-key",
            "ANTHROPIC_BASE_URL": fake.url,
            "SIGNALBOX_MAX_RUNNING_TURNS_PER_USER": str(PER_USER),
            "SIGNALBOX_RATE_LIMIT_TURNS": "100000/minute",
            "SIGNALBOX_RATE_LIMIT_WRITES": "100000/minute",
        },
    )
    stack = Stack(config)
    stack.start()
    yield stack
    stack.stop()


def _user(sessions: sessionmaker[Session]) -> str:
    with sessions() as session:
        _user_row, token = create_user(session, f"fair-{uuid.uuid4().hex[:8]}")
        session.commit()
    return token


async def _send(client: httpx.AsyncClient, token: str, label: str) -> str:
    """A new conversation and one turn in it; the turn's id."""
    auth = {"Authorization": f"Bearer {token}"}
    conv = await client.post("/api/conversations", json={}, headers=auth)
    conv.raise_for_status()
    turn = await client.post(
        f"/api/conversations/{conv.json()['conversation_id']}/turns",
        json={"text": label},
        headers=auth,
    )
    turn.raise_for_status()
    return str(turn.json()["turn_id"])


def _turns(sessions: sessionmaker[Session], turn_ids: list[str]) -> list[Turn]:
    with sessions() as s:
        return list(s.scalars(select(Turn).where(Turn.id.in_(turn_ids))))


def _start_s(sessions: sessionmaker[Session], turn_id: str) -> float:
    """Seconds from the turn's storing to its start, once it started."""

    def started() -> tuple[float] | None:  # a tuple: a start of 0.0 s is still "started"
        [turn] = _turns(sessions, [turn_id])
        if turn.started_at is None:
            return None
        return ((as_utc(turn.started_at) - as_utc(turn.created_at)).total_seconds(),)

    found = wait_until(started, 120.0, f"turn {turn_id} started", interval_s=0.02)
    assert found is not None  # wait_until returns only a truthy value
    return found[0]


def test_a_flood_from_one_user_does_not_delay_another(
    fair_stack: Stack,
    fake: FakeAnthropic,
    stack_sessions: sessionmaker[Session],
) -> None:
    fake.script([[stall(ANSWER_S), text("done")] for _ in range(FLOOD + 20)])
    noisy, quiet = _user(stack_sessions), _user(stack_sessions)

    async def scenario() -> tuple[list[float], float, str, list[str]]:
        async with http_calls.AsyncClient(base_url=fair_stack.gateway_url, timeout=60.0) as client:
            await _send(client, quiet, "warm-up")  # the first turn also starts the SDK's client
            unloaded = []
            for i in range(3):  # B's start on the idle stack
                turn_id = await _send(client, quiet, f"quiet alone {i}")
                unloaded.append(await asyncio.to_thread(_start_s, stack_sessions, turn_id))
            flood = await asyncio.gather(
                *(_send(client, noisy, f"noisy {i}") for i in range(FLOOD))
            )
            await asyncio.sleep(1.0)  # "a second later": the scenario's own timing
            loaded_turn = await _send(client, quiet, "quiet under load")
            loaded = await asyncio.to_thread(_start_s, stack_sessions, loaded_turn)
            return unloaded, loaded, loaded_turn, list(flood)

    unloaded, loaded, loaded_turn, flood = asyncio.run(scenario())
    baseline = statistics.median(unloaded)
    [b_turn] = _turns(stack_sessions, [loaded_turn])
    assert b_turn.started_at is not None  # _start_s waited for it
    b_stored, b_started = as_utc(b_turn.created_at), as_utc(b_turn.started_at)
    a_turns = _turns(stack_sessions, flood)
    ahead = [t for t in a_turns if t.started_at is None or as_utc(t.started_at) > b_stored]
    overtook = [t for t in ahead if t.started_at and as_utc(t.started_at) < b_started]
    print(
        f"B starts in {baseline * 1000:.0f} ms alone, {loaded * 1000:.0f} ms under A's flood;"
        f" {len(overtook)} of the {len(ahead)} turns A had waiting started before it"
    )
    assert len(ahead) >= 4 * PER_USER, (
        f"only {len(ahead)} of A's turns were waiting when B's was stored: no test of order"
    )
    assert len(overtook) < len(ahead) // 2, (
        f"{len(overtook)} of the {len(ahead)} turns A had waiting started before B's"
    )

    def all_done() -> bool:
        return all(t.status == TurnState.COMPLETED for t in _turns(stack_sessions, flood))

    wait_until(all_done, 180.0, "every one of A's turns completed", interval_s=0.2)
    turns = _turns(stack_sessions, flood)
    # A got its share the whole time and never more: at most PER_USER ran at once.
    spans = sorted((as_utc(t.started_at), 1) for t in turns if t.started_at) + sorted(
        (as_utc(t.finished_at), -1) for t in turns if t.finished_at
    )
    running = peak = 0
    for _moment, change in sorted(spans):
        running += change
        peak = max(peak, running)
    assert peak <= PER_USER
