"""Benchmarks of the gateway under load: event relay latency, and idle connections.

``relay``: a producer process appends events to N conversations' streams with the
orchestrator's own code (``signalbox.shared.event_stream.EventStream.append``), each carrying its
send time (``time.monotonic``, one clock for every process on Linux); N WebSocket
clients, one per conversation, record when each arrives. The baseline is the same
producer writing raw ``XADD`` entries and N raw ``XREAD BLOCK`` readers on the same Redis.

``connections``: 10,000 idle WebSockets over two gateway processes; resident memory per
connection from ``/proc/<pid>/status``, heartbeat CPU from ``/proc/<pid>/stat``; then a
pass with permessage-deflate on, and the bytes a typical turn's events take on the wire
with and without it.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import time
import zlib
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
    """What one relay round saw: latencies (ms), events never received, refused subscribes,
    and the CPU seconds Redis and the gateway spent from the producer's start to its end."""

    samples: list[float]
    lost: int
    refused: list[str]
    redis_cpu_s: float | None = None  # None: a Redis the bench did not start
    gateway_cpu_s: float | None = None

    def us_per_event(self, cpu_s: float | None) -> float | None:
        """``cpu_s`` per event appended, in µs."""
        events = len(self.samples) + self.lost
        return round(cpu_s / events * 1e6, 1) if events and cpu_s is not None else None


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
    server = env.redis_server.process  # None: a Redis the bench did not start
    gateway_pid = env.gateway().pid
    try:
        redis_before = proc_cpu_s(server.pid) if server is not None else 0.0
        gateway_before = proc_cpu_s(gateway_pid)
        process, start_at = _spawn_producer(env, conversations, duration_s, False, period)
        until = start_at + duration_s + 10
        await asyncio.gather(
            *(_read_ws(ws, b, until) for ws, b in zip(sockets, buckets, strict=True))
        )
        await asyncio.to_thread(_join, process)
        gateway_s = proc_cpu_s(gateway_pid) - gateway_before
        redis_s = proc_cpu_s(server.pid) - redis_before if server is not None else None
    finally:
        await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
    samples = [s for b in buckets for s in b.samples]
    return RelayRound(samples, per * len(sockets) - len(samples), refused, redis_s, gateway_s)


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
                    # Over the measured round (each process's /proc, 10 ms ticks).
                    "redis_cpu_us_per_event": ours.us_per_event(ours.redis_cpu_s),
                    "gateway_cpu_us_per_event": ours.us_per_event(ours.gateway_cpu_s),
                },
            )
        )
    return results


# -- the connections benchmark -----------------------------------------------------------

HEARTBEAT_S = 1.0  # the bench gateway beats every second, so a few seconds show its cost
DEFAULT_HEARTBEAT_S = 15.0  # PROTOCOL.md: a heartbeat every 15 s on an idle socket
GATEWAYS = 2  # the idle sockets are spread over this many gateway processes
SOCKETS = 10_000  # in all (issue 20: 10,000 idle sockets over 2 gateway processes)
DEFLATE_SOCKETS = 2_000  # the pass with compression on: its cost per socket, not its reach
TARGET_KIB = 50.0  # per idle socket, with the default settings


async def _idle_sockets(urls: list[str], token: str, n: int) -> list[ClientConnection]:
    """``n`` sockets, spread evenly over ``urls``; every client offers permessage-deflate, as
    browsers do (the server's setting decides whether it is used)."""
    limit = asyncio.Semaphore(CONNECT_CONCURRENCY)

    async def one(url: str) -> ClientConnection:
        async with limit:
            return await connect(
                url,
                additional_headers={"Authorization": f"Bearer {token}"},
                ping_interval=None,
                max_queue=None,  # heartbeats pile up unread; nothing pushes back on the server
                open_timeout=300,
                compression="deflate",
            )

    return await asyncio.gather(*(one(urls[i % len(urls)]) for i in range(n)))


async def _connections(
    pids: list[int], urls: list[str], token: str, n: int, window_s: float
) -> dict[str, float]:
    warm = await _idle_sockets(urls, token, 20 * len(urls))
    await asyncio.gather(*(ws.close() for ws in warm))
    await asyncio.sleep(0.5)  # let the closed sessions' tasks end before the first reading
    rss_before = sum(proc_status_kib(pid) for pid in pids)
    started = time.perf_counter()
    sockets = await _idle_sockets(urls, token, n)
    connect_s = time.perf_counter() - started
    await asyncio.sleep(HEARTBEAT_S * 2)  # the first heartbeats, then a steady state
    rss_after = sum(proc_status_kib(pid) for pid in pids)
    cpu_before = sum(proc_cpu_s(pid) for pid in pids)
    wall_before = time.monotonic()
    await asyncio.sleep(window_s)  # the measured window: nothing but idle sockets
    cpu_s = sum(proc_cpu_s(pid) for pid in pids) - cpu_before
    wall_s = time.monotonic() - wall_before
    extensions = sorted({e.name for ws in sockets for e in ws.protocol.extensions})
    await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
    return {
        "rss_before_kib": rss_before,
        "rss_after_kib": rss_after,
        "kib_per_connection": (rss_after - rss_before) / n,
        "connect_s": connect_s,
        "cpu_s": cpu_s,
        "wall_s": wall_s,
        "vm_hwm_kib": sum(proc_status_kib(pid, "VmHWM") for pid in pids),
        "deflate_negotiated": float("permessage-deflate" in extensions),
    }


def _pass(
    env: BenchEnv, token: str, name: str, gateways: int, n: int, window_s: float, **overrides: str
) -> dict[str, float]:
    """``n`` idle sockets over ``gateways`` fresh gateway processes (fresh, so memory freed by
    an earlier pass is not reused and hides the cost)."""
    children = [
        env.extra_gateway(
            f"{name}{i + 1}",
            SIGNALBOX_HEARTBEAT_S=str(HEARTBEAT_S),
            SIGNALBOX_WS_IDLE_TIMEOUT_S="3600",
            **overrides,
        )
        for i in range(gateways)
    ]
    try:
        urls = [url.replace("http://", "ws://") + "/ws" for _child, url in children]
        pids = [child.pid for child, _url in children]
        return asyncio.run(_connections(pids, urls, token, n, window_s))
    finally:
        for child, _url in children:
            env.stop_extra(child)


def _typical_turn() -> list[str]:
    """The frames of a turn shaped like the ``load`` workload's (3 steps of 4 tool calls, then
    an answer): about 40 events, as the gateway relays them."""
    from signalbox.services.gateway.relay import frame_prefix, relay_frame
    from signalbox.shared.event_stream import encode

    turn_id, prefix = new_id("turn"), frame_prefix(new_id("conv"))
    kinds: list[tuple[str, dict[str, Any]]] = [
        ("turn_queued", {"text": "look at the repository and fix the failing test"}),
        ("turn_started", {"model": "claude-sonnet-4-5"}),
    ]
    for step in range(3):
        kinds += [
            ("text_delta", {"text": f"Step {step}: reading the files "}),
            ("text_delta", {"text": "that matter."}),
            ("assistant_message", {"text": f"Step {step}: reading the files that matter."}),
        ]
        calls = [new_id("call") for _ in range(4)]
        kinds += [
            (
                "tool_call_started",
                {
                    "call_id": c,
                    "tool": "read_file",
                    "input": {"path": f"src/module_{i}.py"},
                    "timeout_s": 30.0,
                },
            )
            for i, c in enumerate(calls)
        ]
        kinds += [
            (
                "tool_call_finished",
                {
                    "call_id": c,
                    "tool": "read_file",
                    "status": "ok",
                    "output": "def f(x):\n    return x + 1\n",
                    "duration_ms": 3,
                },
            )
            for c in calls
        ]
    kinds += [
        ("text_delta", {"text": "The test failed because "}),
        ("text_delta", {"text": "f was off by one; "}),
        ("text_delta", {"text": "proposed a fix."}),
        (
            "assistant_message",
            {"text": "The test failed because f was off by one; proposed a fix."},
        ),
        (
            "turn_finished",
            {
                "status": "completed",
                "steps": 4,
                "usage": {"input_tokens": 5120, "output_tokens": 230},
            },
        ),
    ]
    frames = []
    for n, (kind, data) in enumerate(kinds):
        raw = encode(kind, data, turn_id)["e"]  # type: ignore[arg-type]
        relayed = relay_frame(prefix, f"1764000000000-{n}", raw)
        assert relayed is not None
        frames.append(relayed[1])
    return frames


def _wire_bytes(frames: list[str], deflate: bool) -> int:
    """Bytes on the wire of server frames (unmasked headers); ``deflate``: compressed as
    permessage-deflate with context takeover and uvicorn's defaults (15 window bits)."""
    compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    total = 0
    for frame in frames:
        payload = frame.encode()
        if deflate:
            payload = compressor.compress(payload) + compressor.flush(zlib.Z_SYNC_FLUSH)
            payload = payload[:-4]  # the 00 00 ff ff every flush ends with is not sent
        total += len(payload) + (2 if len(payload) < 126 else 4)
    return total


def connections(env: BenchEnv, quick: bool, rounds: int) -> list[Result]:
    """Idle WebSockets over two gateway processes: memory each, and what heartbeats cost;
    then the same with permessage-deflate on, and what it saves on a turn's events."""
    n = 100 if quick else SOCKETS
    n_deflate = 50 if quick else DEFLATE_SOCKETS
    window_s = 2.0 if quick else 6.0
    env.stop_tools()
    env.stop_noop()
    _user_id, token = env.user()
    per_conn: list[float] = []
    core_share: list[float] = []
    figures: dict[str, float] = {}
    for _ in range(max(1, rounds)):
        figures = _pass(env, token, "gateway-connections", GATEWAYS, n, window_s)
        per_conn.append(figures["kib_per_connection"])
        core_share.append(figures["cpu_s"] / figures["wall_s"])
    # The same with compression turned on, on fresh processes, fewer sockets: its cost each.
    deflate = _pass(
        env, token, "gateway-deflate", 1, n_deflate, 1.0, SIGNALBOX_WS_PER_MESSAGE_DEFLATE="true"
    )
    turn = _typical_turn()
    plain_bytes, deflate_bytes = _wire_bytes(turn, False), _wire_bytes(turn, True)
    share_1s = statistics.median(core_share)
    # Idle sockets cost nothing but their heartbeats, so the cost scales with the beat rate.
    share_default = share_1s * HEARTBEAT_S / DEFAULT_HEARTBEAT_S
    measured = Series("resident memory per idle connection", per_conn, unit="KiB")
    return [
        Result(
            id="connections",
            what=f"{n} idle WebSockets over {GATEWAYS} gateway processes: resident memory "
            "added per connection; CPU of heartbeats",
            measured=measured,
            baseline=None,
            target=f"≤ {TARGET_KIB:g} KiB each by default, {SOCKETS:,} sockets over "
            f"{GATEWAYS} processes; heartbeats < 5% of a core",
            met=measured.median <= TARGET_KIB and share_default < 0.05 and (quick or n >= SOCKETS),
            extra={
                "connections": n,
                "gateway_processes": GATEWAYS,
                "heartbeat_s_measured": HEARTBEAT_S,
                "core_share_at_1s_heartbeat": round(share_1s, 4),
                "core_share_at_15s_heartbeat": round(share_default, 4),
                "connect_s": round(figures.get("connect_s", 0.0), 3),
                "rss_before_kib": figures.get("rss_before_kib"),
                "rss_after_kib": figures.get("rss_after_kib"),
                "deflate_negotiated_by_default": bool(figures.get("deflate_negotiated")),
                "fd_limit": env.fd_limit,
                "kib_per_connection_with_deflate": round(deflate["kib_per_connection"], 1),
                "deflate_connections": n_deflate,
                "turn_events": len(turn),
                "turn_wire_bytes": plain_bytes,
                "turn_wire_bytes_with_deflate": deflate_bytes,
            },
            notes=[
                f"The gateways ran with a heartbeat every {HEARTBEAT_S:g} s so a "
                f"{window_s:g} s window holds several beats per socket; the share at the "
                f"default {DEFAULT_HEARTBEAT_S:g} s is scaled from it (idle sockets do "
                "nothing else). The CPU share is of both processes together and also holds "
                "everything else they did in the window.",
                f"Server and client ran with an fd limit of {env.fd_limit}.",
                "Clients offered permessage-deflate, as browsers do; the gateway declines it "
                "by default (SIGNALBOX_WS_PER_MESSAGE_DEFLATE). "
                "`kib_per_connection_with_deflate` is a second pass, on a fresh gateway "
                f"process with it on, over {n_deflate} sockets. `turn_wire_bytes*`: the "
                f"{len(turn)} frames of a turn shaped like the `load` workload's, as sent "
                "(frame headers included), plain and compressed with context takeover.",
            ],
        )
    ]
