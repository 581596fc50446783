"""Heartbeats and idle timeouts from the gateway's one clock, and the socket's outbox.

The clock's bounds (never early, at most one slot late) are checked exactly by driving
``SocketClock.tick`` with times of the test's own; on a real gateway they are checked for
"never early" exactly and for lateness only within a generous allowance (2 loaded cores).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import random
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
import websockets

from signalbox.services.gateway.socket_clock import SLOTS_PER_PERIOD, SocketClock, slot_for
from signalbox.services.gateway.state import Gateway
from signalbox.services.gateway.ws_session import Outbox, WsSession, heartbeat_text
from signalbox.shared.events import utc_now
from signalbox.shared.protocol import Heartbeat
from signalbox.shared.settings import GatewaySettings, SettingsError, load
from tests.gateway.conftest import RECV_TIMEOUT_S, LiveGateway, connect, request

pytestmark = pytest.mark.anyio

# What a loaded 2-core machine may add to a deadline on top of the clock's own slot: only
# the upper bounds of the live tests use it, never the lower ones.
LOADED_LOOP_ALLOWANCE_S = 2.0
FAR_S = 10_000.0  # loop times this far ahead are never reached by the clock's own task


class Recorder:
    """A clocked client that records each call and answers the deadlines it is given."""

    def __init__(self, dues: list[float]) -> None:
        self.dues = dues
        self.calls: list[tuple[float, float]] = []  # (deadline, now)
        self.called = asyncio.Event()

    def on_clock(self, now: float) -> float | None:
        self.calls.append((self.dues[0], now))
        self.called.set()
        self.dues.pop(0)
        return self.dues[0] if self.dues else None


def state_of(gateway: LiveGateway) -> Gateway:
    state: Gateway = gateway.app.state.gateway
    return state


class Sessions:
    """The sessions the gateways of this test ran, and a count of those that ended."""

    def __init__(self) -> None:
        self.started: list[WsSession] = []
        self._ended = threading.Semaphore(0)

    async def wait_ended(self, n: int) -> None:
        """Wait (with a deadline each) until ``n`` more sessions have returned from run."""
        for _ in range(n):
            assert await asyncio.to_thread(self._ended.acquire, timeout=RECV_TIMEOUT_S)


@pytest.fixture
def sessions(monkeypatch: pytest.MonkeyPatch) -> Sessions:
    """Every ``WsSession.run`` of the test, recorded (the gateways run in other threads)."""
    found = Sessions()
    original = WsSession.run

    async def run(session: WsSession) -> None:
        found.started.append(session)
        try:
            await original(session)
        finally:
            found._ended.release()

    monkeypatch.setattr(WsSession, "run", run)
    return found


# -- the clock, driven by the test's own times ---------------------------------------------


@pytest.mark.parametrize("period_s", [1.0, 15.0, 0.05, 0.6150000000000001, 1 / 3])
async def test_a_due_client_is_called_never_early_and_at_most_one_slot_late(
    period_s: float,
) -> None:
    slot = slot_for(period_s, 300.0)
    assert slot == pytest.approx(period_s / SLOTS_PER_PERIOD)
    clock = SocketClock(slot)
    rng = random.Random(20)
    base = asyncio.get_running_loop().time() + FAR_S + rng.random()
    clients = [Recorder([base + rng.uniform(0.0, period_s)]) for _ in range(1_000)]
    try:
        for client in clients:
            clock.register(client, client.dues[0])
        assert clock.registered == 1_000
        # Ticks at the start of every slot, as the task makes them on an idle loop.
        first, last = math.floor(base / slot), math.ceil((base + period_s) / slot) + 1
        for index in range(first, last + 1):
            clock.tick(index * slot)
        for client in clients:
            assert len(client.calls) == 1
            due, now = client.calls[0]
            assert now >= due  # never early
            assert now - due <= slot * (1 + 1e-9)  # at most one slot (2% of the period) late
        assert (clock.registered, clock.slots) == (0, 0)
    finally:
        await clock.aclose()


async def test_a_tick_calls_only_the_clients_that_are_due() -> None:
    clock = SocketClock(0.02)
    base = asyncio.get_running_loop().time() + FAR_S
    early = [Recorder([base + 0.001 * i]) for i in range(10)]
    later = [Recorder([base + 1.0 + 0.01 * i]) for i in range(1_000)]
    try:
        for client in early + later:
            clock.register(client, client.dues[0])
        clock.tick(base + 0.04)  # the slots of every early deadline have begun
        assert all(len(c.calls) == 1 for c in early)
        assert not any(c.calls for c in later)
        assert clock.registered == len(later)
    finally:
        await clock.aclose()


async def test_a_client_that_answers_a_next_deadline_is_called_again_then() -> None:
    clock = SocketClock(0.02)
    base = asyncio.get_running_loop().time() + FAR_S
    client = Recorder([base, base + 0.5, base + 1.0])
    try:
        clock.register(client, client.dues[0])
        for index in range(math.floor(base / 0.02), math.ceil((base + 1.0) / 0.02) + 2):
            clock.tick(index * 0.02)
        assert [due for due, _now in client.calls] == [base, base + 0.5, base + 1.0]
        assert all(0 <= now - due <= 0.02 + 1e-9 for due, now in client.calls)
        assert client not in clock
    finally:
        await clock.aclose()


async def test_a_failing_client_is_dropped_and_the_others_still_called(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Failing:
        def on_clock(self, now: float) -> float | None:
            raise RuntimeError("boom")

    clock = SocketClock(0.02)
    base = asyncio.get_running_loop().time() + FAR_S
    failing, fine = Failing(), Recorder([base, base + 5.0])
    try:
        clock.register(failing, base)
        clock.register(fine, base)
        clock.tick(base + 0.02)
        assert failing not in clock
        assert fine in clock and len(fine.calls) == 1
        assert "clock callback failed" in caplog.text
    finally:
        await clock.aclose()


async def test_a_client_unregistered_by_another_s_callback_is_not_called() -> None:
    clock = SocketClock(0.02)
    base = asyncio.get_running_loop().time() + FAR_S
    victim = Recorder([base, base + 5.0])

    class Unregistering:
        def on_clock(self, now: float) -> float | None:
            clock.unregister(victim)
            return None

    try:
        for _ in range(20):  # whichever of the two the bucket yields first
            clock.register(Unregistering(), base)
        clock.register(victim, base)
        clock.tick(base + 0.02)
        assert len(victim.calls) <= 1
        assert clock.registered == 0
    finally:
        await clock.aclose()


async def test_the_task_wakes_for_a_client_due_before_the_slot_it_sleeps_until() -> None:
    """Real time: the task sleeps until a far deadline; a nearer one registered after it is
    still met (waited for with a deadline, not a sleep)."""
    clock = SocketClock(0.01)
    now = asyncio.get_running_loop().time()
    far, near = Recorder([now + FAR_S]), Recorder([now + 0.05])
    try:
        clock.register(far, far.dues[0])
        await asyncio.sleep(0)  # let the task start and go to sleep until the far slot
        clock.register(near, near.dues[0])
        await asyncio.wait_for(near.called.wait(), RECV_TIMEOUT_S)
        ((due, at),) = near.calls
        assert at >= due
        assert not far.calls and far in clock and near not in clock
    finally:
        await clock.aclose()


async def test_unregister_forgets_the_client_and_its_empty_slot() -> None:
    clock = SocketClock(0.02)
    base = asyncio.get_running_loop().time() + FAR_S
    clients = [Recorder([base + i]) for i in range(5)]
    try:
        for client in clients:
            clock.register(client, client.dues[0])
        for client in clients:
            clock.unregister(client)
            clock.unregister(client)  # twice is harmless
        assert (clock.registered, clock.slots) == (0, 0)
        clock.tick(base + 10.0)
        assert not any(c.calls for c in clients)
    finally:
        await clock.aclose()


async def test_a_deadline_that_never_comes_registers_nothing() -> None:
    """Heartbeat and idle timeout both ``inf`` (settings accept it): no socket is ever due,
    and registering one must not fail (``inf / inf`` made every connection fail)."""
    forever = math.inf
    for slot in (slot_for(forever, forever), slot_for(1.0, forever)):
        clock = SocketClock(slot)
        never = Recorder([forever])
        try:
            clock.register(never, forever)
            assert never not in clock and (clock.registered, clock.slots) == (0, 0)
        finally:
            await clock.aclose()


# -- the outbox -----------------------------------------------------------------------------


async def test_the_outbox_keeps_order_under_a_burst() -> None:
    outbox: Outbox[int] = Outbox(10_000)
    got: list[int] = []

    async def writer() -> None:
        while len(got) < 10_000:
            got.append(await outbox.get())
            if len(got) % 7 == 0:
                await asyncio.sleep(0)  # the writer falls behind now and then

    task = asyncio.create_task(writer())
    for start in range(0, 10_000, 1_000):  # bursts, the writer running in between
        for i in range(start, start + 1_000):
            outbox.put_nowait(i)
        await asyncio.sleep(0)
    await asyncio.wait_for(task, RECV_TIMEOUT_S)
    assert got == list(range(10_000))
    assert len(outbox) == 0


async def test_the_outbox_limit_is_the_queue_s() -> None:
    """Same puts, same refusals as the asyncio.Queue it replaced (``maxsize`` 0: unbounded)."""
    for maxsize in (0, 1, 3):
        outbox: Outbox[int] = Outbox(maxsize)
        queue: asyncio.Queue[int] = asyncio.Queue(maxsize)
        for step in range(12):
            results = []
            for box in (outbox, queue):
                try:
                    if step % 4 == 3:
                        results.append(("got", await box.get()))
                    else:
                        box.put_nowait(step)
                        results.append(("put", step))
                except asyncio.QueueFull:
                    results.append(("full", step))
            assert results[0] == results[1], (maxsize, step)
            assert len(outbox) == queue.qsize()


async def test_a_waiting_get_is_woken_and_survives_a_cancel() -> None:
    outbox: Outbox[str] = Outbox(2)
    waiting = asyncio.create_task(outbox.get())
    await asyncio.sleep(0)  # it waits on the outbox's future
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    getter = asyncio.create_task(outbox.get())
    await asyncio.sleep(0)
    outbox.put_nowait("a")
    outbox.put_nowait("b")
    assert await asyncio.wait_for(getter, RECV_TIMEOUT_S) == "a"
    outbox.put_nowait("c")  # "a" is out: room for one more
    with pytest.raises(asyncio.QueueFull):
        outbox.put_nowait("d")
    assert [await outbox.get(), await outbox.get()] == ["b", "c"]


# -- the heartbeat frame --------------------------------------------------------------------


def test_the_preformatted_heartbeat_is_the_model_s_json() -> None:
    rng = random.Random(20)
    moments = [0, 999, 1_000, 1_764_000_000_000, 1_764_000_000_999, 4_102_444_799_999]
    moments += [rng.randrange(0, 4_102_444_800_000) for _ in range(2_000)]
    for ms in moments:
        moment = datetime.fromtimestamp(ms // 1000, UTC).replace(microsecond=ms % 1000 * 1000)
        ts = moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        assert heartbeat_text(ms) == Heartbeat(ts=ts).model_dump_json()
    assert heartbeat_text(1_764_000_000_123) == (
        '{"type":"heartbeat","ts":"2025-11-24T16:00:00.123Z"}'
    )
    # As the writer made it before, at the moment it was sent: the same bytes.
    for _ in range(200):
        before = Heartbeat(ts=utc_now()).model_dump_json()
        ts = json.loads(before)["ts"]
        sent = datetime.fromisoformat(ts.replace("Z", "+00:00"))
        assert heartbeat_text(round(sent.timestamp() * 1000)) == before
    # One text per millisecond, shared.
    assert heartbeat_text(1_764_000_000_456) is heartbeat_text(1_764_000_000_456)


# -- on a real gateway ----------------------------------------------------------------------


async def test_heartbeats_go_out_on_schedule(
    start_gateway: Callable[..., LiveGateway],
    make_user: Callable[[], tuple[str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each beat is queued when it is due, never before, and about one slot after at most;
    every beat queued reaches the client, byte for byte the model's frame."""
    heartbeat_s = 0.5
    slot = slot_for(heartbeat_s, 60.0)
    beats: list[tuple[float, float]] = []  # (due, queued), the gateway's loop time
    original = WsSession.on_clock

    def recording(session: WsSession, now: float) -> float | None:
        due = session._last_sent + session._heartbeat_s
        before = session._last_sent
        answer = original(session, now)
        if session._last_sent != before:
            beats.append((due, now))
        return answer

    monkeypatch.setattr(WsSession, "on_clock", recording)
    gateway = start_gateway(heartbeat_s=heartbeat_s, ws_idle_timeout_s=60.0)
    _, token = make_user()
    async with await connect(gateway, token) as ws:
        raws = [await asyncio.wait_for(ws.recv(), RECV_TIMEOUT_S) for _ in range(6)]
    for raw in raws:
        assert isinstance(raw, str)
        assert Heartbeat.model_validate_json(raw).model_dump_json() == raw
    assert len(beats) >= 6
    for due, queued in beats:
        assert queued >= due  # never early
        assert queued - due <= 0.02 * heartbeat_s + slot + LOADED_LOOP_ALLOWANCE_S
    # Each counted from when the one before was queued, not from when it was written.
    for (_, queued), (due, _) in itertools.pairwise(beats):
        assert due == queued + heartbeat_s


async def test_a_silent_client_is_closed_1001_never_before_the_idle_timeout(
    start_gateway: Callable[..., LiveGateway],
    make_user: Callable[[], tuple[str, str]],
    sessions: Sessions,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    idle_s = 1.0
    closes: list[tuple[float, float]] = []  # (due: last heard + idle_s, when the clock closed)
    original = WsSession.on_clock

    def recording(session: WsSession, now: float) -> float | None:
        due = session._last_received + session._idle_timeout_s
        was_closing = session._closing.done()
        answer = original(session, now)
        if session._closing.done() and not was_closing:
            closes.append((due, now))
        return answer

    monkeypatch.setattr(WsSession, "on_clock", recording)
    gateway = start_gateway(heartbeat_s=0.2, ws_idle_timeout_s=idle_s)
    _, token = make_user()
    started = time.monotonic()
    async with await connect(gateway, token) as ws:
        with pytest.raises(websockets.ConnectionClosed) as closed:
            while True:
                frame = json.loads(await asyncio.wait_for(ws.recv(), RECV_TIMEOUT_S))
                assert frame["type"] == "heartbeat"
        waited = time.monotonic() - started
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
    assert waited >= idle_s  # the client's own clock: never closed before the timeout
    # The close, in the gateway's loop time: never early, late by at most its slot (plus
    # what a loaded machine adds). Not the client's wall time, which also holds the
    # connect and its sign-in on a busy machine (3.5 s once in CI).
    [(due, closed_at)] = closes
    assert closed_at >= due
    assert closed_at - due <= 0.02 * idle_s + slot_for(0.2, idle_s) + LOADED_LOOP_ALLOWANCE_S
    await sessions.wait_ended(1)
    clock = state_of(gateway).ws_clock
    assert sessions.started[0] not in clock
    assert (clock.registered, clock.slots) == (0, 0)


async def test_closed_sockets_are_unregistered(
    start_gateway: Callable[..., LiveGateway],
    make_user: Callable[[], tuple[str, str]],
    sessions: Sessions,
) -> None:
    sockets = 20
    gateway = start_gateway(heartbeat_s=0.2)
    clock = state_of(gateway).ws_clock
    _, token = make_user()
    clients = [await connect(gateway, token) for _ in range(sockets)]
    for ws in clients:
        assert (await request(ws, {"type": "ping"}))["type"] == "pong"  # its session runs
    assert clock.registered == sockets
    assert len(sessions.started) == sockets
    assert all(session in clock for session in sessions.started)
    await asyncio.gather(*(ws.close() for ws in clients))
    await sessions.wait_ended(sockets)
    assert not any(session in clock for session in sessions.started)
    assert (clock.registered, clock.slots) == (0, 0)


async def test_replies_keep_their_order_under_a_burst(
    start_gateway: Callable[..., LiveGateway], make_user: Callable[[], tuple[str, str]]
) -> None:
    """200 pings sent at once, heartbeats due all along: the pongs come back in order."""
    gateway = start_gateway(heartbeat_s=0.05)
    _, token = make_user()
    async with await connect(gateway, token) as ws:
        for i in range(200):
            await ws.send(json.dumps({"type": "ping", "req": str(i)}))
        pongs: list[str] = []
        while len(pongs) < 200:
            frame = json.loads(await asyncio.wait_for(ws.recv(), RECV_TIMEOUT_S))
            if frame["type"] != "heartbeat":
                assert frame["type"] == "pong", frame
                pongs.append(frame["req"])
    assert pongs == [str(i) for i in range(200)]


@pytest.mark.parametrize("variable", ["SIGNALBOX_HEARTBEAT_S", "SIGNALBOX_WS_IDLE_TIMEOUT_S"])
@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_period_of_zero_or_less_is_refused_at_start_naming_it(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    """A heartbeat or idle timeout of 0 would spin the clock at its 1 ms floor (or close
    every socket at once): the gateway does not start, and says which setting is wrong."""
    monkeypatch.setenv("SIGNALBOX_INTERNAL_TOKEN", "a-test-internal-token-" + "x" * 16)
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError, match=variable):
        load(GatewaySettings)
    monkeypatch.setenv(variable, "inf")  # off
    assert math.isinf(getattr(load(GatewaySettings), variable.removeprefix("SIGNALBOX_").lower()))
