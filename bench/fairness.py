"""Fair scheduling under a noisy neighbour: ten quiet users' turns with and without one
user who keeps the deployment saturated (shared/admission.py).

Each quiet user sends turns one after another (a new conversation each, an instant model
answer); the figure is the time from the turn's storing to its start (``created_at`` →
``started_at``, both written by the services, so no polling error). Measured three ways
in one run: no noisy user (the baseline); a noisy user with ``NOISY_TURNS`` turns queued at
once, each taking ``NOISY_ANSWER_S`` of model time, under the default fair share; and the
same flood through a gateway with no per-user limit (every turn admitted at once, so the
orchestrator queue is first come, first served: what Signalbox did before fair scheduling).
"""

from __future__ import annotations

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from sqlalchemy import select

from bench.environment import BenchEnv
from bench.stats import Result, Series
from signalbox.shared.db import Turn
from signalbox.shared.db.models import as_utc
from signalbox.shared.statuses import TurnState
from tests.fake_anthropic import stall, text

QUIET_USERS = 10
NOISY_ANSWER_S = 0.2
TIMEOUT_S = 300.0
# How often a quiet user looks whether its turn finished (its next one goes out then). The
# figure is read from SQL timestamps, so this only paces the users; at 10 users a faster
# poll is itself a load on the database (hundreds of queries a second on PostgreSQL).
POLL_S = 0.1


def _send(client: httpx.Client, token: str, label: str) -> str:
    auth = {"Authorization": f"Bearer {token}"}
    conv = client.post("/api/conversations", json={}, headers=auth)
    conv.raise_for_status()
    turn = client.post(
        f"/api/conversations/{conv.json()['conversation_id']}/turns",
        json={"text": label},
        headers=auth,
    )
    turn.raise_for_status()
    return str(turn.json()["turn_id"])


def _finished(env: BenchEnv, turn_ids: list[str]) -> list[Turn]:
    with env.sessions() as s:
        rows = list(s.scalars(select(Turn).where(Turn.id.in_(turn_ids))))
    return [t for t in rows if t.status not in (TurnState.QUEUED, TurnState.RUNNING)]


def _wait_finished(env: BenchEnv, turn_ids: list[str]) -> list[Turn]:
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        done = _finished(env, turn_ids)
        if len(done) == len(turn_ids):
            return done
        if time.monotonic() > deadline:
            raise RuntimeError(f"fairness: {len(turn_ids) - len(done)} turns did not finish")
        time.sleep(POLL_S)  # across processes: polled, with a deadline


def _start_ms(turn: Turn) -> float:
    assert turn.started_at is not None
    return (as_utc(turn.started_at) - as_utc(turn.created_at)).total_seconds() * 1000


def _quiet_round(env: BenchEnv, url: str, tokens: list[str], rounds: int) -> list[float]:
    """Every quiet user sends ``rounds`` turns, one after another; their start times."""
    samples: list[float] = []
    lock = threading.Lock()

    def user(token: str, index: int) -> None:
        with httpx.Client(base_url=url, timeout=60.0) as client:
            for r in range(rounds):
                turn_id = _send(client, token, f"QUIET {index}.{r}")
                [turn] = _wait_finished(env, [turn_id])
                with lock:
                    samples.append(_start_ms(turn))

    with ThreadPoolExecutor(len(tokens)) as pool:
        for future in [pool.submit(user, t, i) for i, t in enumerate(tokens)]:
            future.result()
    return samples


def _flood(url: str, token: str, turns: int) -> list[str]:
    with httpx.Client(base_url=url, timeout=60.0) as client, ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda i: _send(client, token, f"NOISY {i}"), range(turns)))


def fairness(env: BenchEnv, rounds: int, quick: bool) -> list[Result]:
    """Quiet users' start latency: alone, beside a noisy user (fair), and first-come."""
    env.gateway()
    env.orchestrator()
    noisy_turns = 40 if quick else 200
    env.fake.script_for("QUIET", [[text("ok", chunks=1)] for _ in range(100_000)])
    env.fake.script_for(
        "NOISY", [[stall(NOISY_ANSWER_S), text("ok", chunks=1)] for _ in range(3 * noisy_turns)]
    )
    url = env.stack.gateway_url
    tokens = [env.user()[1] for _ in range(QUIET_USERS)]
    _quiet_round(env, url, tokens, 1)  # warm-up: clients, connections, caches
    alone = _quiet_round(env, url, tokens, rounds)

    _noisy_id, noisy = env.user()
    flood = _flood(url, noisy, noisy_turns)
    fair = _quiet_round(env, url, tokens, rounds)
    left = len(flood) - len(_finished(env, flood))
    _wait_finished(env, flood)

    # The same flood through a gateway that admits every turn at once.
    child, fifo_url = env.extra_gateway("gateway-fifo", SIGNALBOX_MAX_RUNNING_TURNS_PER_USER="0")
    try:
        flood = _flood(fifo_url, noisy, noisy_turns)
        fifo = _quiet_round(env, fifo_url, tokens, rounds)
        _wait_finished(env, flood)
    finally:
        env.stop_extra(child)

    baseline = Series("quiet users alone", alone)
    measured = Series("quiet users beside a noisy one (fair share)", fair)
    first_come = Series("quiet users beside a noisy one (no per-user limit)", fifo)
    ratio = measured.median / baseline.median if baseline.median else float("nan")
    return [
        Result(
            id="fairness",
            what=(
                f"{QUIET_USERS} quiet users' turn start (stored → started) beside one user "
                f"with {noisy_turns} turns queued ({NOISY_ANSWER_S} s of model time each)"
            ),
            measured=measured,
            baseline=baseline,
            target="quiet users' p50 ≤ 2x and p99 ≤ 3x their figures with no noisy user",
            met=measured.median <= 2 * baseline.median and measured.p99 <= 3 * baseline.p99,
            notes=[
                f"p50 {measured.median:.0f} ms against {baseline.median:.0f} ms alone "
                f"({ratio:.2f}x); p99 {measured.p99:.0f} ms against {baseline.p99:.0f} ms",
                f"without a per-user limit (first come, first served): p50 "
                f"{first_come.median:.0f} ms, p99 {first_come.p99:.0f} ms",
                f"{left} of the noisy user's {noisy_turns} turns were still unfinished when "
                "the quiet users' last turn finished",
            ],
            extra={"first_come": first_come.summary(), "median_of_alone": statistics.median(alone)},
        )
    ]
