"""The load run of issue 7: many conversations at once through the whole stack.

200 conversations start at the same moment, each on its own WebSocket (asyncio clients
in this process), each a turn of 3 tool steps x 4 parallel calls and an answer, scripted
per conversation on the fake Messages API (``tests.fake_anthropic``). The stack is the
real one: 2 orchestrators, 2 prefork tool workers, one gateway (``GATEWAYS``).

Checked after the run, not assumed: every turn ended ``completed``; every client
received every event of its conversation's Redis stream exactly once and in order (the
stream, read with ``XRANGE`` after the run, is the reference); the tool ran exactly as
often as the model asked (``count_calls`` counts real executions, one counter per
conversation). Figures: turns per second, latency of each turn (``user_turn`` sent →
``turn_finished`` received), lost, duplicated and out-of-order events. The baseline is
the same turn alone on the same stack. New ERROR/WARNING lines in the services' logs
during the run are counted and sampled into the result, as evidence of what went wrong.

CPU per turn is measured by process (each process with its children, from ``/proc``) and
set against bare Celery in the same run (issue 20): the task hops the run really made
(the ``run_turn`` deliveries the orchestrators received and the ``run_tool`` calls the tool
workers received, counted from their Celery ``received`` log lines) are then made by bare
Celery (``bench.noop_app``'s no-op task, on bare prefork workers of the tool pool's shape)
in the same shape: the turns' deliveries at once, then each step's calls at once for every
turn, a round waiting for the one before; the CPU of its workers, Redis and the producer.
On PostgreSQL the server's own CPU (``postgresql server``: every process of it, when it runs
on this machine) is part of the stack, as SQLite's is inside the services' processes.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import statistics
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis
from celery import Celery
from celery.result import AsyncResult, ResultSet
from sqlalchemy import func, select
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from bench.environment import BenchEnv, postgres_server_cpu_s, proc_cpu_s, proc_tree_cpu_s
from bench.gateway_load import CONNECT_CONCURRENCY
from bench.noop_app import NOOP_QUEUE, NOOP_TASK
from bench.stats import Result, Series
from bench.turns import MODEL_STEPS, TOOL_STEPS, TOOLS_PER_STEP
from signalbox.processes import Child, log_contains
from signalbox.services.tools.test_tools import counter_key
from signalbox.shared.db.models import ToolCall, Turn
from signalbox.shared.event_stream import id_after
from tests.fake_anthropic import Scripted, text, tool_use

CONVERSATIONS = 200
QUICK_CONVERSATIONS = 10
ORCHESTRATORS = 2
TOOL_WORKERS = 2
TOOLS_CONCURRENCY = 4  # prefork slots per tool worker: the Stack's (and `signalbox up`'s) default
GATEWAYS = 1
# Instant, and each counts its real executions (a re-run shows). The same function: one is
# declared quick (a step's calls of it go as one task, services/tools/batches.py), the other
# is not (a task per call), so the two load runs differ only in the tool hop.
TOOL = "count_quick"
PER_CALL_TOOL = "count_calls"
RUN_DEADLINE_S = 150.0  # every turn finished by then, or it is reported stuck
QUICK_RUN_DEADLINE_S = 60.0
CATCH_UP_S = 10.0  # after the last turn_finished: time for trailing events to arrive
REDIS_TOP_COMMANDS = 12  # the most frequent Redis commands of a run, per turn, on the page
ALONE_TURNS = 5  # baseline: the same turn alone, back to back
QUICK_ALONE_TURNS = 1
LOG_SAMPLES = 8  # distinct problem lines kept per process
# Match words (a traceback's lines carry no level); lines at INFO or DEBUG are not problems,
# in shared/log_config.py's format ("<time> INFO    gateway uvicorn.error: ...": the logger's
# name holds "error") or Celery's own ("[...: INFO/MainProcess]").
_PROBLEM = re.compile(
    r"\b(error|critical|exception|traceback|warning|locked|too many)\b", re.IGNORECASE
)
_INFO = re.compile(r": (INFO|DEBUG)/|^INFO:|^\S+ (INFO|DEBUG) ")
_WARNING = re.compile(r"\bwarn(ing)?\b", re.IGNORECASE)
_STAMP = re.compile(r"^\[[^\]]*\]\s*|\d{4}-\d\d-\d\d[ T][\d:,.]+\s*")
# Celery's worker logs this (at INFO) for every message it takes: the hops actually made.
_RECEIVED = re.compile(
    r"Task (orchestrator\.run_turn|tools\.run_tool|tools\.run_batch)\[[^\]]+\] received"
)
# The tool workers log this (at INFO) for every call they ran (services/tools/tasks.py).
_CALL_RAN = re.compile(r"call call_\w+: \S+ (ok|error|timeout) in \d+ ms")
BARE_ROUND_TIMEOUT_S = 120.0
BARE_WARMUP_TASKS = 16
PUBLISH_BATCH_MAX = 1000  # as the orchestrator's dispatcher: a round's messages in few trips
BENCH_PROCESS = "bench (clients + fake model)"  # outside the stack: not in its CPU per turn
POSTGRES_SERVER = "postgresql server"  # on --postgres with the server on this machine


def _script(marker: str, tool: str) -> list[Scripted]:
    """The model's answers for one conversation: 3 steps of 4 tool calls, then an answer."""
    steps: list[Scripted] = [
        [text(f"step {n}", chunks=1)]
        + [tool_use(tool, {"key": marker}) for _ in range(TOOLS_PER_STEP)]
        for n in range(1, TOOL_STEPS + 1)
    ]
    steps.append([text("done", chunks=1)])
    return steps


@dataclass
class Client:
    """One conversation's WebSocket client and everything it saw."""

    marker: str  # in the user text (the fake model's script key) and the client_turn_id
    token: str
    url: str
    ws: ClientConnection | None = None
    sent_at: float | None = None
    finished_at: float | None = None
    conversation_id: str | None = None
    turn_id: str | None = None
    status: str | None = None
    steps: int | None = None
    refused: str | None = None  # the error reply to user_turn
    closed: str | None = None  # why the socket ended early
    ids: list[str] = field(default_factory=list)
    foreign: int = 0  # events of another conversation on this socket
    expected_last: str | None = None
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    caught_up: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def latency_ms(self) -> float | None:
        """``user_turn`` sent → ``turn_finished`` received, if both happened."""
        if self.sent_at is None or self.finished_at is None:
            return None
        return (self.finished_at - self.sent_at) * 1000

    def _seen(self, event_id: str) -> None:
        self.ids.append(event_id)
        if self.expected_last is not None and not id_after(self.expected_last, event_id):
            self.caught_up.set()

    def expect(self, last_id: str | None) -> None:
        """The stream's last id after the run: ``caught_up`` is set once it has arrived."""
        self.expected_last = last_id
        if last_id is None or (self.ids and not id_after(last_id, self.ids[-1])):
            self.caught_up.set()

    def on_frame(self, frame: dict[str, Any]) -> None:
        """Record one server frame."""
        kind = frame.get("type")
        if kind == "event":
            if self.conversation_id is not None and frame["conversation_id"] != (
                self.conversation_id
            ):
                self.foreign += 1
                return
            self._seen(str(frame["id"]))
            if frame["kind"] == "turn_finished" and frame.get("turn_id") == self.turn_id:
                self.finished_at = time.monotonic()
                self.status = frame["data"]["status"]
                self.steps = frame["data"]["steps"]
                self.finished.set()
        elif frame.get("req") == self.marker:
            if kind == "ack":
                self.conversation_id = frame["conversation_id"]
                self.turn_id = frame["turn_id"]
            elif kind == "error":
                self.refused = f"{frame.get('code')}: {frame.get('message')}"
                self.finished.set()  # nothing more will come for this turn on this socket


async def _connect(client: Client, limit: asyncio.Semaphore) -> None:
    async with limit:
        client.ws = await connect(
            client.url,
            additional_headers={"Authorization": f"Bearer {client.token}"},
            ping_interval=None,
            max_queue=None,  # never push back on the gateway: its own backpressure is measured
            open_timeout=60,
        )


async def _read(client: Client) -> None:
    assert client.ws is not None
    try:
        async for raw in client.ws:
            client.on_frame(json.loads(raw))
    except ConnectionClosed as exc:
        client.closed = f"closed: {exc}"
    else:
        client.closed = "closed by the server"
    finally:
        # A socket that ended will see nothing more: let the waits below end now.
        client.finished.set()
        client.caught_up.set()


async def _send(client: Client) -> None:
    assert client.ws is not None
    frame = {
        "type": "user_turn",
        "conversation_id": None,
        "text": f"run the tools {client.marker}",
        "client_turn_id": client.marker,
        "req": client.marker,
    }
    client.sent_at = time.monotonic()
    await client.ws.send(json.dumps(frame))


async def _wait_all(events: list[asyncio.Event], timeout_s: float) -> None:
    waits = [asyncio.create_task(e.wait()) for e in events]
    _done, pending = await asyncio.wait(waits, timeout=timeout_s)
    for task in pending:
        task.cancel()


async def _drive(env: BenchEnv, clients: list[Client], deadline_s: float) -> None:
    """Connect every client, send every turn at once, wait for them and their last events."""
    limit = asyncio.Semaphore(CONNECT_CONCURRENCY)
    readers: list[asyncio.Task[None]] = []
    events = aioredis.Redis.from_url(env.redis_url, decode_responses=True)
    try:
        await asyncio.gather(*(_connect(c, limit) for c in clients))
        readers = [asyncio.create_task(_read(c)) for c in clients]
        await asyncio.gather(*(_send(c) for c in clients))
        await _wait_all([c.finished for c in clients], deadline_s)
        for c in clients:
            if c.conversation_id is None:
                c.expect(None)
                continue
            last: Any = await events.xrevrange(env.keys.events(c.conversation_id), count=1)
            c.expect(last[0][0] if last else None)
        await _wait_all([c.caught_up for c in clients], CATCH_UP_S)
    finally:
        for task in readers:
            task.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        await asyncio.gather(
            *(c.ws.close() for c in clients if c.ws is not None), return_exceptions=True
        )
        await events.aclose()


# -- the checks ------------------------------------------------------------------------


@dataclass
class Delivery:
    """Every client's events against its conversation's stream."""

    expected: int = 0
    received: int = 0
    lost: int = 0
    duplicated: int = 0
    out_of_order: int = 0
    foreign: int = 0
    unknown: int = 0  # received, but not in the stream


def _delivery(env: BenchEnv, clients: list[Client]) -> Delivery:
    tally = Delivery()
    for c in clients:
        if c.conversation_id is None:
            continue
        stream: Any = env.redis.xrange(env.keys.events(c.conversation_id))
        want = [eid.decode() if isinstance(eid, bytes) else str(eid) for eid, _f in stream]
        got = c.ids
        tally.expected += len(want)
        tally.received += len(got)
        tally.lost += len(set(want) - set(got))
        tally.duplicated += len(got) - len(set(got))
        tally.unknown += len(set(got) - set(want))
        tally.out_of_order += sum(1 for a, b in itertools.pairwise(got) if id_after(a, b))
        tally.foreign += c.foreign
    return tally


@dataclass
class SqlView:
    """What SQL says of the run's turns and tool calls (SQL is the truth)."""

    turn_statuses: dict[str, int]
    tool_call_statuses: dict[str, int]
    missing_turns: int  # sent, but no turn stored for its client_turn_id
    stored: set[str]  # the client_turn_ids (markers) with a stored turn
    span_s: float  # first turn stored → last turn finished, by SQL's own clock


def _sql_view(env: BenchEnv, clients: list[Client]) -> SqlView:
    markers = [c.marker for c in clients]
    with env.sessions() as s:
        turns = dict(
            s.execute(
                select(Turn.client_turn_id, Turn.id).where(Turn.client_turn_id.in_(markers))
            ).all()
        )
        statuses = dict(
            s.execute(
                select(Turn.status, func.count())
                .where(Turn.id.in_(list(turns.values())))
                .group_by(Turn.status)
            ).all()
        )
        first, last = s.execute(
            select(func.min(Turn.created_at), func.max(Turn.finished_at)).where(
                Turn.id.in_(list(turns.values()))
            )
        ).one()
        calls = dict(
            s.execute(
                select(ToolCall.status, func.count())
                .where(ToolCall.turn_id.in_(list(turns.values())))
                .group_by(ToolCall.status)
            ).all()
        )
    return SqlView(
        turn_statuses={str(k): int(v) for k, v in statuses.items()},
        tool_call_statuses={str(k): int(v) for k, v in calls.items()},
        missing_turns=len(set(markers) - set(turns)),
        stored={str(m) for m in turns},
        span_s=(last - first).total_seconds() if first and last else 0.0,
    )


def _executions(env: BenchEnv, clients: list[Client]) -> dict[str, int]:
    """Real runs of the tool per conversation, from ``count_calls``'s counters."""
    keys = [counter_key(env.keys, c.marker) for c in clients]
    values: list[Any] = env.redis.mget(keys) if keys else []
    counts = [int(v) if v is not None else 0 for v in values]
    want = TOOL_STEPS * TOOLS_PER_STEP
    return {
        "executions": sum(counts),
        "expected": want * len(clients),
        "conversations_over": sum(1 for n in counts if n > want),
        "conversations_under": sum(1 for n in counts if n < want),
    }


def _cpu(env: BenchEnv) -> dict[str, float]:
    """CPU seconds so far of each process (a prefork worker with its pool)."""
    pids = {c.name: c.pid for c in [*env.stack.children.values(), *env.extra_children]}
    if env.redis_server.process is not None:
        pids["redis"] = env.redis_server.process.pid
    used = {name: proc_tree_cpu_s([pid]) for name, pid in pids.items()}
    # This process alone: the clients and the fake model server (its children are services).
    used[BENCH_PROCESS] = proc_cpu_s(os.getpid())
    # PostgreSQL's own work is the stack's as much as SQLite's, which runs inside the services.
    database = postgres_server_cpu_s(env.database_url)
    if database is not None:
        used[POSTGRES_SERVER] = database
    return used


def _redis_calls(env: BenchEnv) -> dict[str, int]:
    """Commands the run's Redis has served so far, by name (``INFO commandstats``)."""
    client = redis.Redis.from_url(env.redis_url)
    try:
        stats: dict[str, dict[str, Any]] = client.info("commandstats")
    finally:
        client.close()
    return {name.removeprefix("cmdstat_"): int(s["calls"]) for name, s in stats.items()}


def _redis_per_turn(before: dict[str, int], after: dict[str, int], turns: int) -> dict[str, Any]:
    """Redis commands per turn over the run, all and the most frequent: unlike CPU seconds,
    a count that does not move with the machine's speed or its other load."""
    made = {name: calls - before.get(name, 0) for name, calls in after.items()}
    made = {name: n for name, n in made.items() if n > 0 and name != "info"}
    per_turn = max(1, turns)
    top = sorted(made.items(), key=lambda item: -item[1])[:REDIS_TOP_COMMANDS]
    return {
        "total": round(sum(made.values()) / per_turn, 1),
        "by_command": {name: round(n / per_turn, 1) for name, n in top},
    }


def _stack_cpu_ms(cpu_s: dict[str, float], turns: int) -> float:
    """CPU per turn of the stack's processes (not the bench's clients and fake model)."""
    return sum(v for k, v in cpu_s.items() if k != BENCH_PROCESS) * 1000 / max(1, turns)


@dataclass(frozen=True)
class Hops:
    """The Celery task hops a run made, counted from the workers' ``received`` lines."""

    deliveries: int  # ``orchestrator.run_turn`` messages the orchestrators took
    tool_calls: int  # tool calls the tool workers ran
    tool_tasks: int  # the tasks they came in: ``tools.run_tool`` and ``tools.run_batch``
    counted_from: str  # "worker logs", or "plan" where the logs said nothing (no INFO)


def _hops(env: BenchEnv, since: dict[Path, int], turns: int) -> Hops:
    found = {"orchestrator.run_turn": 0, "tools.run_tool": 0, "tools.run_batch": 0}
    calls = 0
    for path in (env.var_dir / "logs").glob("*.log"):
        with open(path, "rb") as log:
            log.seek(since.get(path, 0))
            text = log.read().decode(errors="replace")
        for match in _RECEIVED.finditer(text):
            found[match.group(1)] += 1
        calls += sum(1 for _ in _CALL_RAN.finditer(text))
    if found["orchestrator.run_turn"] == 0:  # logs above INFO: what the design sends at least
        planned = turns * TOOL_STEPS * TOOLS_PER_STEP
        return Hops(turns, planned, planned, "plan")
    tasks = found["tools.run_tool"] + found["tools.run_batch"]
    return Hops(found["orchestrator.run_turn"], calls, tasks, "worker logs")


@dataclass(frozen=True)
class BareRun:
    """Bare Celery making a run's hops: the tasks of each round, CPU seconds by process."""

    workers: str
    rounds: list[int]
    cpu_s: dict[str, float]
    wall_s: float


def _bare_round(app: Celery, size: int) -> None:
    """``size`` no-op tasks published at once (one batch, as the dispatcher does), then every
    result awaited (the Redis backend's pub/sub: Celery's own way to gather a group)."""
    sent: list[AsyncResult[Any]] = []
    with app.producer_or_acquire() as producer, producer.batch(PUBLISH_BATCH_MAX):
        for _ in range(size):
            sent.append(app.send_task(NOOP_TASK, queue=NOOP_QUEUE, producer=producer))
    ResultSet(list(sent), app=app).get(timeout=BARE_ROUND_TIMEOUT_S, interval=0.005)


def _bare_celery(env: BenchEnv, stack: LoadStack, hops: Hops) -> BareRun:
    """The run's hops made by bare Celery on workers of the tool pool's shape."""
    pool = env.noop_workers(stack.tool_workers, stack.tools_concurrency)
    app = env.celery("bench-bare-load")
    per_step, extra = divmod(hops.tool_calls, TOOL_STEPS)
    rounds = [hops.deliveries] + [per_step + (1 if i < extra else 0) for i in range(TOOL_STEPS)]
    try:
        _bare_round(app, BARE_WARMUP_TASKS)  # connections and the result subscriber, set up
        pids = {"workers": pool.pids}
        if env.redis_server.process is not None:
            pids["redis"] = [env.redis_server.process.pid]

        def used() -> dict[str, float]:
            cpu = {name: proc_tree_cpu_s(p) for name, p in pids.items()}
            cpu["producer (bench process)"] = proc_cpu_s(os.getpid())
            return cpu

        before = used()
        began = time.monotonic()
        for size in rounds:
            if size:
                _bare_round(app, size)
        wall_s = time.monotonic() - began
        after = used()
    finally:
        app.close()
        env.stop_noop()
    return BareRun(
        workers=f"{stack.tool_workers} x {stack.tools_concurrency} prefork",
        rounds=rounds,
        cpu_s={k: round(after[k] - before[k], 3) for k in after},
        wall_s=wall_s,
    )


def _cpu_extra(
    cpu_s: dict[str, float], turns: int, hops: Hops, bare: BareRun | None
) -> dict[str, Any]:
    """The CPU figures of a run: per turn by process, and against bare Celery's hops."""
    per_turn = max(1, turns)
    stack_ms = _stack_cpu_ms(cpu_s, turns)
    found: dict[str, Any] = {
        "cpu_ms_per_turn": {k: round(v * 1000 / per_turn, 2) for k, v in cpu_s.items()},
        "stack_cpu_ms_per_turn": round(stack_ms, 2),
        "hops": {
            "run_turn_deliveries": hops.deliveries,
            "tool_calls": hops.tool_calls,
            "tool_tasks": hops.tool_tasks,
            "per_turn": round((hops.deliveries + hops.tool_calls) / per_turn, 3),
            "tasks_per_turn": round((hops.deliveries + hops.tool_tasks) / per_turn, 3),
            "counted_from": hops.counted_from,
        },
    }
    if bare is not None:
        tasks = sum(bare.rounds)
        bare_s = sum(bare.cpu_s.values())
        bare_ms = bare_s * 1000 / per_turn
        found["bare_celery"] = {
            "workers": bare.workers,
            "tasks": tasks,
            "rounds": bare.rounds,
            "wall_s": round(bare.wall_s, 2),
            "cpu_s": bare.cpu_s,
            "cpu_ms_per_turn": {k: round(v * 1000 / per_turn, 2) for k, v in bare.cpu_s.items()},
            "cpu_ms_per_turn_total": round(bare_ms, 2),
            "cpu_ms_per_task": round(bare_s * 1000 / max(1, tasks), 3),
        }
        found["cpu_ratio_to_bare_celery"] = round(stack_ms / bare_ms, 2) if bare_ms else None
    return found


def _log_sizes(env: BenchEnv) -> dict[Path, int]:
    return {p: p.stat().st_size for p in (env.var_dir / "logs").glob("*.log")}


def _log_problems(env: BenchEnv, since: dict[Path, int]) -> dict[str, dict[str, Any]]:
    """ERROR/WARNING lines each service logged since ``since``: counts and distinct samples."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted((env.var_dir / "logs").glob("*.log")):
        with open(path, "rb") as log:
            log.seek(since.get(path, 0))
            lines = log.read().decode(errors="replace").splitlines()
        problems = [line for line in lines if _PROBLEM.search(line) and not _INFO.search(line)]
        if not problems:
            continue
        samples: dict[str, str] = {}
        for line in problems:
            samples.setdefault(_STAMP.sub("", line)[:160], line[:400])
        found[path.stem] = {
            "errors": sum(1 for line in problems if not _WARNING.search(line)),
            "warnings": sum(1 for line in problems if _WARNING.search(line)),
            "samples": list(samples.values())[:LOG_SAMPLES],
        }
    return found


# -- the benchmark ---------------------------------------------------------------------


@dataclass
class LoadStack:
    """What the load runs on: gateway URLs, the tool pool's shape, the processes it added."""

    urls: list[str]
    tool_workers: int
    tools_concurrency: int
    added: list[Child] = field(default_factory=list)  # stopped again at the end


def _start(env: BenchEnv, gateways: int, quick: bool, warmup: int, tool: str) -> LoadStack:
    """The load's stack, with ``warmup`` turns run while the second orchestrator starts."""
    env.gateway()
    env.orchestrator()
    added = []
    for i in range(2, ORCHESTRATORS + 1):
        # Started without waiting: its start-up overlaps the tool workers' and the warm-up.
        name = f"orchestrator{i}"
        child = Child(
            name=name,
            args=env.stack.commands.orchestrator(f"{name}@%h"),
            log_path=env.var_dir / "logs" / f"{name}.log",
            env=env.env(),
        )
        env.extra_children.append(child)
        child.start()
        added.append(child)
    pool = env.tools_pool
    if not quick or pool is None:  # the smoke run keeps whatever pool the last benchmark left
        pool = env.tools(TOOL_WORKERS, TOOLS_CONCURRENCY)
    stack = LoadStack([env.stack.gateway_url], pool.processes, pool.concurrency, added)
    for i in range(2, gateways + 1):
        child, url = env.extra_gateway(f"gateway{i}")
        stack.added.append(child)
        stack.urls.append(url)
    stack.urls = [u.replace("http://", "ws://") + "/ws" for u in stack.urls]
    _alone(env, stack.urls, warmup, tool)
    for child in added:
        child.wait_ready(log_contains(child, " ready."))
    return stack


def _stop_added(env: BenchEnv, stack: LoadStack | None) -> None:
    """Leave the stack as the other benchmarks expect it: one orchestrator, one gateway."""
    for child in stack.added if stack is not None else []:
        env.stop_extra(child)


def _clients(env: BenchEnv, urls: list[str], n: int, tool: str) -> list[Client]:
    run = uuid.uuid4().hex[:8]
    clients = []
    for i in range(n):
        marker = f"load-{run}-{i:05d}"  # fixed width: no marker is a prefix of another
        env.fake.script_for(marker, _script(marker, tool))
        _user_id, token = env.user()
        clients.append(Client(marker=marker, token=token, url=urls[i % len(urls)]))
    return clients


def _alone(env: BenchEnv, urls: list[str], turns: int, tool: str) -> list[float]:
    """The same turn alone, back to back: latency of each (ms)."""
    samples = []
    for _ in range(turns):
        (client,) = _clients(env, urls[:1], 1, tool)
        asyncio.run(_drive(env, [client], QUICK_RUN_DEADLINE_S))
        if client.status != "completed" or client.latency_ms is None:
            raise RuntimeError(
                f"load: a turn alone did not complete: status {client.status!r}, "
                f"refused {client.refused!r}, socket {client.closed!r}"
            )
        samples.append(client.latency_ms)
    return samples


def load(
    env: BenchEnv,
    quick: bool,
    warmup: int,
    conversations: int | None = None,
    gateways: int = GATEWAYS,
    tool: str = TOOL,
) -> list[Result]:
    """``conversations`` turns of 3 steps x 4 tools at once: completion, delivery, latency.

    ``tool``: ``TOOL`` (a step's 4 calls go as one task), or ``PER_CALL_TOOL`` (a task each).
    """
    n = conversations or (QUICK_CONVERSATIONS if quick else CONVERSATIONS)
    deadline_s = QUICK_RUN_DEADLINE_S if quick else RUN_DEADLINE_S
    stack: LoadStack | None = None
    try:
        stack = _start(env, gateways, quick, warmup, tool)
        alone = _alone(env, stack.urls, QUICK_ALONE_TURNS if quick else ALONE_TURNS, tool)
        logs_before = _log_sizes(env)
        clients = _clients(env, stack.urls, n, tool)
        cpu_before, redis_before = _cpu(env), _redis_calls(env)
        began = time.monotonic()
        asyncio.run(_drive(env, clients, deadline_s))
        wall_s = time.monotonic() - began
        cpu_after, redis_after = _cpu(env), _redis_calls(env)
        problems = _log_problems(env, logs_before)
        hops = _hops(env, logs_before, n)
    finally:
        _stop_added(env, stack)
    cpu_s = {k: round(cpu_after[k] - cpu_before.get(k, 0.0), 2) for k in cpu_after}
    bare = _bare_celery(env, stack, hops)
    result = _result(env, clients, alone, wall_s, problems, stack, cpu_s, tool)
    result.extra.update(_cpu_extra(cpu_s, n, hops, bare))
    result.extra["redis_commands_per_turn"] = _redis_per_turn(redis_before, redis_after, n)
    return [result]


def _result(
    env: BenchEnv,
    clients: list[Client],
    alone: list[float],
    wall_s: float,
    problems: dict[str, dict[str, Any]],
    stack: LoadStack,
    cpu_s: dict[str, float],
    tool: str,
) -> Result:
    n = len(clients)
    delivery = _delivery(env, clients)
    sql = _sql_view(env, clients)
    executions = _executions(env, clients)
    finished = [c for c in clients if c.latency_ms is not None]
    latencies = [c.latency_ms for c in clients if c.latency_ms is not None]
    completed = [c for c in finished if c.status == "completed" and c.steps == MODEL_STEPS]
    refused = [c for c in clients if c.refused is not None]
    closed_early = [c for c in clients if c.closed is not None and c.finished_at is None]
    sent = [c.sent_at for c in clients if c.sent_at is not None]
    ends = [c.finished_at for c in clients if c.finished_at is not None]
    span_s = max(ends) - min(sent) if ends and sent else 0.0
    turns_per_s = len(completed) / span_s if span_s > 0 else 0.0
    sql_completed = sql.turn_statuses.get("completed", 0)
    sql_turns_per_s = sql_completed / sql.span_s if sql.span_s > 0 else 0.0
    met = (
        len(completed) == n
        and sql_completed == n
        and delivery.lost == 0
        and delivery.duplicated == 0
        and delivery.out_of_order == 0
        and delivery.foreign == 0
        and delivery.unknown == 0
        and executions["executions"] == executions["expected"]
    )
    notes = _notes(n, completed, refused, closed_early, delivery, sql, executions, problems)
    measured = Series(f"turn latency, {n} at once", latencies)
    return Result(
        id="load",
        variant=str(n)
        + ("-per-call" if tool == PER_CALL_TOOL else "")
        + ("-postgres" if env.on_postgres else ""),
        what=f"{n} conversations at once, one WebSocket client each, each a turn of "
        f"{TOOL_STEPS} steps x {TOOLS_PER_STEP} parallel `{tool}` calls then an answer "
        + ("(a task per call)" if tool == PER_CALL_TOOL else "(a step's calls as one task)")
        + " "
        f"(fake model over HTTP); {ORCHESTRATORS} orchestrators, {stack.tool_workers} tool "
        f"workers ({stack.tools_concurrency} prefork slots each), {len(stack.urls)} gateway(s). "
        "Latency: "
        "`user_turn` sent → `turn_finished` received; baseline: the same turn alone",
        measured=measured,
        baseline=Series("the same turn alone", alone),
        target="every turn completed; every event once, in order (0 lost, 0 duplicated)",
        met=met,
        notes=notes,
        extra={
            "conversations": n,
            "gateways": len(stack.urls),
            "orchestrators": ORCHESTRATORS,
            "tool_workers": stack.tool_workers,
            "tools_concurrency": stack.tools_concurrency,
            "turns_per_s": round(turns_per_s, 2),
            "turns_per_s_sql": round(sql_turns_per_s, 2),
            "wall_s": round(wall_s, 2),
            "completed": len(completed),
            "finished_other": sorted({str(c.status) for c in finished if c not in completed}),
            "no_turn_finished": n - len(finished) - len(refused),
            "refused": len(refused),
            "closed_early": len(closed_early),
            "sql_turn_statuses": sql.turn_statuses,
            "sql_tool_call_statuses": sql.tool_call_statuses,
            "sql_missing_turns": sql.missing_turns,
            "events_expected": delivery.expected,
            "events_received": delivery.received,
            "lost_events": delivery.lost,
            "duplicated_events": delivery.duplicated,
            "out_of_order_events": delivery.out_of_order,
            "foreign_events": delivery.foreign,
            "unknown_events": delivery.unknown,
            "tool_executions": executions["executions"],
            "tool_executions_expected": executions["expected"],
            "alone_ms_median": round(statistics.median(alone), 3) if alone else None,
            "cpu_s": cpu_s,
            "log_problems": problems,
        },
    )


def _notes(
    n: int,
    completed: list[Client],
    refused: list[Client],
    closed_early: list[Client],
    delivery: Delivery,
    sql: SqlView,
    executions: dict[str, int],
    problems: dict[str, dict[str, Any]],
) -> list[str]:
    notes = []
    if refused:
        reasons = sorted({str(c.refused)[:200] for c in refused})
        stored = sum(1 for c in refused if c.marker in sql.stored)
        notes.append(
            f"{len(refused)} of {n} `user_turn` frames were answered `error`: {stored} of "
            f"them after their turn was stored and enqueued (it ran, unseen by its client), "
            f"{len(refused) - stored} before anything was stored. First reason: {reasons[0]}"
        )
    if closed_early:
        notes.append(
            f"{len(closed_early)} sockets ended before their turn finished: "
            f"{sorted({str(c.closed) for c in closed_early})[0]}"
        )
    if len(completed) < n:
        notes.append(
            f"{len(completed)} of {n} clients saw their turn complete; SQL holds turns by "
            f"status {sql.turn_statuses} (missing: {sql.missing_turns}), tool calls by status "
            f"{sql.tool_call_statuses}."
        )
    if delivery.lost or delivery.duplicated or delivery.out_of_order or delivery.unknown:
        notes.append(
            f"Delivery, over the conversations whose `user_turn` was acknowledged: "
            f"{delivery.lost} lost, {delivery.duplicated} duplicated, "
            f"{delivery.out_of_order} out of order, {delivery.unknown} not in the stream, "
            f"of {delivery.expected} events in the streams."
        )
    if executions["executions"] != executions["expected"]:
        notes.append(
            f"The tool ran {executions['executions']} times for {executions['expected']} "
            f"calls asked ({executions['conversations_over']} conversations over, "
            f"{executions['conversations_under']} under)."
        )
    for process, found in problems.items():
        if found["errors"]:
            notes.append(
                f"{process} logged {found['errors']} error lines during the run, e.g. "
                f"`{found['samples'][0][:300]}`"
            )
    return notes
