"""Benchmarks of the gateway under load: event relay latency, and idle connections.

``relay``: a producer process appends events to N conversations' streams with the
orchestrator's own code (``signalbox.shared.event_stream.EventStream.append``), each carrying its
send time (``time.monotonic``, one clock for every process on Linux); N WebSocket
clients, one per conversation, record when each arrives. The baseline is the same
producer writing raw ``XADD`` entries and N raw ``XREAD BLOCK`` readers on the same Redis.

``connections``: 2,000 idle WebSockets on one gateway process; resident memory per
connection from ``/proc/<pid>/status``, heartbeat CPU from ``/proc/<pid>/stat``.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import redis.asyncio as aioredis
from websockets.asyncio.client import ClientConnection, connect

from bench.environment import BenchEnv, proc_cpu_s, proc_status_kib
from bench.machine import REPO
from bench.stats import Result, Series
from signalbox.processes import wait_until
from signalbox.shared.db.models import Conversation
from signalbox.shared.ids import new_id

PERIOD_S = 0.1  # a conversation streams one event per 100 ms (a model's coalesced deltas)...
MAX_EVENTS_PER_S = 500  # ...until the total reaches this: more saturates a 2-core machine
# (the raw baseline's own p99 passed 1 s at 5,000 events/s), which measures nothing


def period_s(conversations: int) -> float:
    """Seconds between two events of one conversation, at ``conversations`` streaming."""
    return max(PERIOD_S, conversations / MAX_EVENTS_PER_S)


CONNECT_CONCURRENCY = 50  # handshakes in flight at once
SETTLE_S = 1.0  # the producer starts this long after it is spawned (clients are ready)
RAW_BLOCK_MS = 5_000


# -- the producer (a separate process) ---------------------------------------------------


def _spawn_producer(
    env: BenchEnv, streams: list[str], duration_s: float, raw: bool, period: float
) -> tuple[subprocess.Popen[bytes], float]:
    start_at = time.monotonic() + SETTLE_S
    kwargs = {
        "redis_url": env.redis_url,
        "prefix": env.keys.prefix,
        "streams": streams,
        "period_s": period,
        "duration_s": duration_s,
        "start_at": start_at,
        "raw": raw,
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.producer", json.dumps(kwargs)], cwd=REPO
    )
    return process, start_at


def _join(process: subprocess.Popen[bytes]) -> None:
    try:
        code = process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    if code != 0:
        raise RuntimeError(f"the relay producer exited with {code}")


# -- the relay benchmark -----------------------------------------------------------------


@dataclass
class RelayRound:
    """What one relay round saw: latencies (ms), events never received, refused subscribes."""

    samples: list[float]
    lost: int
    refused: list[str]


@dataclass
class _Latencies:
    samples: list[float] = field(default_factory=list)
    expected: int = 0


async def _ws_clients(
    url: str, token: str, conversations: list[str]
) -> tuple[list[ClientConnection], list[str]]:
    """One subscribed socket per conversation; also the errors of subscriptions refused."""
    limit = asyncio.Semaphore(CONNECT_CONCURRENCY)
    refused: list[str] = []

    async def one(conversation_id: str) -> ClientConnection | None:
        async with limit:
            ws = await connect(
                url,
                additional_headers={"Authorization": f"Bearer {token}"},
                ping_interval=None,
                max_queue=None,
                open_timeout=60,
            )
            await ws.send(
                json.dumps(
                    {"type": "subscribe", "conversation_id": conversation_id, "after": None,
                     "req": "s"}
                )
            )  # fmt: skip
            while True:
                frame = json.loads(await ws.recv())
                if frame.get("req") == "s":
                    if frame["type"] == "ack":
                        return ws
                    refused.append(f"{frame.get('code')}: {frame.get('message')}")
                    await ws.close()
                    return None

    sockets = await asyncio.gather(*(one(c) for c in conversations))
    return [ws for ws in sockets if ws is not None], refused


async def _read_ws(ws: ClientConnection, out: _Latencies, until: float) -> None:
    while len(out.samples) < out.expected:
        left = until - time.monotonic()
        if left <= 0:
            return
        try:
            raw = await asyncio.wait_for(ws.recv(), timeout=left)
        except TimeoutError:
            return
        now = time.monotonic()
        frame = json.loads(raw)
        if frame.get("type") == "event":
            out.samples.append((now - float(frame["data"]["sent"])) * 1000)


async def _relay_round(
    env: BenchEnv, gateway_url: str, token: str, conversations: list[str], duration_s: float
) -> RelayRound:
    url = gateway_url.replace("http://", "ws://") + "/ws"
    sockets, refused = await _ws_clients(url, token, conversations)
    period = period_s(len(conversations))
    per = int(duration_s / period)
    buckets = [_Latencies(expected=per) for _ in sockets]
    try:
        process, start_at = _spawn_producer(env, conversations, duration_s, False, period)
        until = start_at + duration_s + 10
        await asyncio.gather(
            *(_read_ws(ws, b, until) for ws, b in zip(sockets, buckets, strict=True))
        )
        await asyncio.to_thread(_join, process)
    finally:
        await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
    samples = [s for b in buckets for s in b.samples]
    return RelayRound(samples, per * len(sockets) - len(samples), refused)


async def _read_raw(client: aioredis.Redis, key: str, out: _Latencies, until: float) -> None:
    last = "0-0"
    while len(out.samples) < out.expected and time.monotonic() < until:
        reply: Any = await client.xread({key: last}, block=RAW_BLOCK_MS)
        now = time.monotonic()
        for _stream, entries in reply or []:
            for entry_id, fields in entries:
                last = entry_id
                out.samples.append((now - float(fields["sent"])) * 1000)


async def _raw_round(
    env: BenchEnv, streams: list[str], duration_s: float
) -> tuple[list[float], int]:
    period = period_s(len(streams))
    per = int(duration_s / period)
    buckets = [_Latencies(expected=per) for _ in streams]
    # One connection per reader: the bare engine at its fastest. (The gateway reads every
    # stream it follows on one connection: services/gateway/stream_reader.py.)
    pool = aioredis.BlockingConnectionPool.from_url(
        env.redis_url, decode_responses=True, max_connections=len(streams) + 4,
        socket_timeout=RAW_BLOCK_MS / 1000 + 10, socket_connect_timeout=30,
    )  # fmt: skip
    client = aioredis.Redis(connection_pool=pool)
    try:
        # Every reader's connection open before the first event, as the sockets are.
        await asyncio.gather(*(client.ping() for _ in streams))
        process, start_at = _spawn_producer(env, streams, duration_s, True, period)
        until = start_at + duration_s + 10
        await asyncio.gather(
            *(_read_raw(client, env.keys.events(s), b, until)
              for s, b in zip(streams, buckets, strict=True))
        )  # fmt: skip
        await asyncio.to_thread(_join, process)
    finally:
        await client.aclose()
        await pool.disconnect()
    samples = [s for b in buckets for s in b.samples]
    return samples, per * len(streams) - len(samples)


def _open_sockets(gateway_url: str) -> float:
    """The gateway's ``signalbox_gateway_connections{transport="ws"}`` gauge."""
    text = httpx.get(f"{gateway_url}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith("signalbox_gateway_connections") and 'transport="ws"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _wait_sessions_closed(gateway_url: str) -> None:
    """Wait until the gateway has ended every session (and so unsubscribed its followers)."""
    wait_until(lambda: _open_sockets(gateway_url) == 0, 30, "gateway sessions to close")


def _conversations(env: BenchEnv, user_id: str, n: int) -> list[str]:
    ids = [new_id("conv") for _ in range(n)]
    with env.sessions() as s, s.begin():
        s.add_all(
            Conversation(id=cid, user_id=user_id, workspace="default", title="relay") for cid in ids
        )
    return ids


def relay(env: BenchEnv, quick: bool, duration_s: float | None = None) -> list[Result]:
    """Event appended → received on a WebSocket, at 1, 100 and 500 streaming conversations."""
    env.stop_tools()  # idle workers only add noise here
    env.stop_noop()
    env.gateway()
    user_id, token = env.user()
    sizes = [1, 10] if quick else [1, 100, 500]
    results = []
    for n in sizes:
        seconds = duration_s or (1.0 if quick else (10.0 if n == 1 else 3.0))
        url = env.stack.gateway_url
        # Warm-up: a short round on other conversations loads every code path once.
        asyncio.run(_relay_round(env, url, token, _conversations(env, user_id, n), 0.5))
        _wait_sessions_closed(url)
        ours = asyncio.run(_relay_round(env, url, token, _conversations(env, user_id, n), seconds))
        _wait_sessions_closed(url)
        raw_streams = [f"raw-{new_id('s')}" for _ in range(n)]
        base, base_lost = asyncio.run(_raw_round(env, raw_streams, seconds))
        if not base:
            raise RuntimeError(f"relay at {n}: not one raw XADD arrived")
        measured = Series(f"relay, {n} conversations", ours.samples)
        baseline = Series(f"raw XADD → XREAD BLOCK, {n} streams", base)
        p99_ratio = measured.p99 / baseline.p99 if measured.samples else None
        met = p99_ratio is not None and p99_ratio <= 3 and not ours.refused
        if n == 100:
            met = met and measured.p99 <= 25
        notes = []
        if ours.refused:
            notes.append(
                f"{len(ours.refused)} of {n} subscriptions were refused "
                f"({sorted(set(ours.refused))[0]}); the figures are of the "
                f"{n - len(ours.refused)} that were accepted."
            )
        results.append(
            Result(
                id="relay",
                variant=str(n),
                what=f"event appended (EventStream.append) → received by a WebSocket client; "
                f"{n} conversation(s), each streaming one event per {period_s(n) * 1000:g} ms, "
                "one socket each",
                measured=measured,
                baseline=baseline,
                target="p99 ≤ 25 ms at 100; p99 ≤ 3x the raw p99",
                met=met,
                notes=notes,
                extra={
                    "p99_ratio": None if p99_ratio is None else round(p99_ratio, 3),
                    "events_per_s": round(n / period_s(n), 1),
                    "subscribed": n - len(ours.refused),
                    "refused": len(ours.refused),
                    "lost": ours.lost,
                    "raw_lost": base_lost,
                },
            )
        )
    return results


# -- the connections benchmark -----------------------------------------------------------

HEARTBEAT_S = 1.0  # the bench gateway beats every second, so a few seconds show its cost
DEFAULT_HEARTBEAT_S = 15.0  # PROTOCOL.md: a heartbeat every 15 s on an idle socket


async def _idle_sockets(
    url: str, token: str, n: int, deflate: bool = True
) -> list[ClientConnection]:
    limit = asyncio.Semaphore(CONNECT_CONCURRENCY)

    async def one() -> ClientConnection:
        async with limit:
            return await connect(
                url,
                additional_headers={"Authorization": f"Bearer {token}"},
                ping_interval=None,
                max_queue=None,  # heartbeats pile up unread; nothing pushes back on the server
                open_timeout=120,
                compression="deflate" if deflate else None,
            )

    return await asyncio.gather(*(one() for _ in range(n)))


async def _connections(
    pid: int, url: str, token: str, n: int, window_s: float, deflate: bool = True
) -> dict[str, float]:
    warm = await _idle_sockets(url, token, 20, deflate)
    await asyncio.gather(*(ws.close() for ws in warm))
    await asyncio.sleep(0.5)  # let the closed sessions' tasks end before the first reading
    rss_before = proc_status_kib(pid)
    started = time.perf_counter()
    sockets = await _idle_sockets(url, token, n, deflate)
    connect_s = time.perf_counter() - started
    await asyncio.sleep(HEARTBEAT_S * 2)  # the first heartbeats, then a steady state
    rss_after = proc_status_kib(pid)
    cpu_before = proc_cpu_s(pid)
    wall_before = time.monotonic()
    await asyncio.sleep(window_s)  # the measured window: nothing but idle sockets
    cpu_s = proc_cpu_s(pid) - cpu_before
    wall_s = time.monotonic() - wall_before
    await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
    return {
        "rss_before_kib": rss_before,
        "rss_after_kib": rss_after,
        "connect_s": connect_s,
        "cpu_s": cpu_s,
        "wall_s": wall_s,
        "vm_hwm_kib": proc_status_kib(pid, "VmHWM"),
    }


def connections(env: BenchEnv, quick: bool, rounds: int) -> list[Result]:
    """Idle WebSockets on one gateway process: memory each, and what heartbeats cost."""
    n = 50 if quick else 2000
    window_s = 2.0 if quick else 6.0
    env.stop_tools()
    env.stop_noop()
    _user_id, token = env.user()
    child, url = env.extra_gateway(
        "gateway-connections",
        SIGNALBOX_HEARTBEAT_S=str(HEARTBEAT_S),
        SIGNALBOX_WS_IDLE_TIMEOUT_S="3600",
    )
    per_conn: list[float] = []
    core_share: list[float] = []
    figures: dict[str, float] = {}
    plain: dict[str, float] = {}
    try:
        ws_url = url.replace("http://", "ws://") + "/ws"
        for _ in range(max(1, rounds)):
            figures = asyncio.run(_connections(child.pid, ws_url, token, n, window_s))
            per_conn.append((figures["rss_after_kib"] - figures["rss_before_kib"]) / n)
            core_share.append(figures["cpu_s"] / figures["wall_s"])
    finally:
        env.stop_extra(child)
    # The same without permessage-deflate (browsers offer it, so it is the figure above), on
    # a fresh process: memory freed by the first pass would be reused and hide the cost.
    child, url = env.extra_gateway(
        "gateway-connections-plain",
        SIGNALBOX_HEARTBEAT_S=str(HEARTBEAT_S),
        SIGNALBOX_WS_IDLE_TIMEOUT_S="3600",
    )
    try:
        ws_url = url.replace("http://", "ws://") + "/ws"
        plain = asyncio.run(_connections(child.pid, ws_url, token, n, 1.0, deflate=False))
    finally:
        env.stop_extra(child)
    share_1s = statistics.median(core_share)
    # Idle sockets cost nothing but their heartbeats, so the cost scales with the beat rate.
    share_default = share_1s * HEARTBEAT_S / DEFAULT_HEARTBEAT_S
    measured = Series("resident memory per idle connection", per_conn, unit="KiB")
    return [
        Result(
            id="connections",
            what=f"{n} idle WebSockets on one gateway process: resident memory added per "
            "connection; CPU of heartbeats",
            measured=measured,
            baseline=None,
            target="≤ 100 KiB each; heartbeats < 5% of a core",
            met=measured.median <= 100 and share_default < 0.05,
            extra={
                "connections": n,
                "heartbeat_s_measured": HEARTBEAT_S,
                "core_share_at_1s_heartbeat": round(share_1s, 4),
                "core_share_at_15s_heartbeat": round(share_default, 4),
                "connect_s": round(figures.get("connect_s", 0.0), 3),
                "rss_before_kib": figures.get("rss_before_kib"),
                "rss_after_kib": figures.get("rss_after_kib"),
                "fd_limit": env.fd_limit,
                "kib_per_connection_without_deflate": round(
                    (plain["rss_after_kib"] - plain["rss_before_kib"]) / n, 1
                ),
            },
            notes=[
                f"The gateway ran with a heartbeat every {HEARTBEAT_S:g} s so a "
                f"{window_s:g} s window holds several beats per socket; the share at the "
                f"default {DEFAULT_HEARTBEAT_S:g} s is scaled from it (idle sockets do "
                "nothing else). The CPU share also holds everything else the process "
                "did in the window.",
                f"Server and client ran with an fd limit of {env.fd_limit}.",
                "Clients offered permessage-deflate, as browsers do; "
                "`kib_per_connection_without_deflate` is a second pass, on a fresh gateway "
                "process, whose clients did not.",
            ],
        )
    ]
