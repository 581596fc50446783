"""``python -m bench.round_trips POSTGRES_URL [TURNS] [--submissions]``: what one turn sends
to PostgreSQL.

The ``turn`` benchmark's in-process loop (as ``bench.profile_loop`` runs it) on a fresh
database of the server at ``POSTGRES_URL``, ``TURNS`` times (default 10) after a warm-up,
counted in the driver: statements, the transaction commands psycopg sends around them
(``BEGIN``, ``COMMIT``, ``ROLLBACK``, ``DEALLOCATE``), the pool's pings, and how psycopg
ran each execution (``prepared: YES``; an ``executemany`` counts one per row, a ping one).
An execution that prepares its statement (``prepared: SHOULD``) costs a round trip of its
own for the ``PREPARE`` before the one that runs it, and the total counts it.
Counts, unlike times, do not move with the machine; bench/analysis.md ("eleventh pass",
"twelfth pass") quotes them.

``--submissions``: instead, what the gateway sends for one turn's submission, as the
``load`` benchmark submits them: ``TURNS`` new users, each on a WebSocket of its own with
one first message (``client_turn_id`` set), to an in-process gateway (uvicorn in a thread),
counted from the socket's opening to the turn's ``ack``. No orchestrator runs: the turns
are admitted and stay queued.

It wraps two of psycopg's internals (``BaseConnection._exec_command`` and
``PrepareManager.get``) for the count: a tool for reading, not a benchmark of record.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
import sys
import threading
import time
from collections import Counter
from typing import Any

import uvicorn
import websockets
from psycopg._connection_base import BaseConnection
from psycopg._preparing import PrepareManager
from sqlalchemy import event
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.engine import Engine

from bench import turns
from bench.environment import BenchEnv
from signalbox.services.gateway.app import create_app, server_config
from signalbox.services.orchestrator.loop import run_turn
from signalbox.shared.settings import GatewaySettings

WARMUP_TURNS = 3
START_TIMEOUT_S = 30.0


class _Counts:
    """What the wrapped calls saw while ``on``."""

    def __init__(self) -> None:
        self.on = False
        self.seen: Counter[str] = Counter()

    def add(self, what: str) -> None:
        if self.on:
            self.seen[what] += 1


def _instrument(counts: _Counts) -> None:
    exec_command = BaseConnection._exec_command
    prepare_get = PrepareManager.get
    do_ping: Any = PGDialect_psycopg.do_ping  # untyped in SQLAlchemy

    def counted_command(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(command, bytes | bytearray | memoryview):
            counts.add(bytes(command).split(maxsplit=1)[0].decode())
        return exec_command(self, command, *args, **kwargs)

    def counted_prepare(self: Any, query: Any, prepare: Any = None) -> Any:
        found = prepare_get(self, query, prepare)
        counts.add(f"prepared: {found[0].name}")
        return found

    def counted_ping(self: Any, dbapi_connection: Any) -> bool:
        counts.add("ping")
        return bool(do_ping(self, dbapi_connection))

    BaseConnection._exec_command = counted_command  # type: ignore[method-assign]
    PrepareManager.get = counted_prepare  # type: ignore[method-assign]
    PGDialect_psycopg.do_ping = counted_ping  # type: ignore[method-assign]

    @event.listens_for(Engine, "before_cursor_execute")
    def _statement(*_args: Any) -> None:
        counts.add("statement")


def _turns(env: BenchEnv, counts: _Counts, count: int) -> None:
    env.tools(1, turns.TOOLS_PER_STEP)  # only for the catalogue the loop reads
    user_id, _token = env.user()
    runtime = turns.in_process_runtime(env)
    for _ in range(WARMUP_TURNS):
        run_turn(runtime, turns.queued_turn(env, user_id))
    queued = [turns.queued_turn(env, user_id) for _ in range(count)]
    counts.on = True
    for turn_id in queued:
        run_turn(runtime, turn_id)
    counts.on = False
    turns.stop_runtime(runtime)


def _submissions(env: BenchEnv, counts: _Counts, count: int) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = GatewaySettings(
        **env.settings_kwargs(),
        internal_token=secrets.token_urlsafe(24),
        proposals_url="http://127.0.0.1:9",  # not asked: nothing here reaches proposals
    )
    app = create_app(settings)
    server = uvicorn.Server(server_config(app, settings, "127.0.0.1", port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:  # another thread's start-up: polled, with a deadline
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the gateway did not start")
        time.sleep(0.01)
    tokens = [env.user()[1] for _ in range(WARMUP_TURNS + count)]

    async def submit(index: int, token: str) -> None:
        if index == WARMUP_TURNS:
            counts.on = True
        headers = {"Authorization": f"Bearer {token}"}
        async with websockets.connect(
            f"ws://127.0.0.1:{port}/ws", additional_headers=headers
        ) as ws:
            frame = {"type": "user_turn", "conversation_id": None, "text": "hi",
                     "client_turn_id": f"c{index}", "req": f"r{index}"}  # fmt: skip
            await ws.send(json.dumps(frame))
            while True:
                reply = json.loads(await ws.recv())
                if reply.get("req") == f"r{index}":
                    if reply.get("type") != "ack":
                        raise RuntimeError(f"the submission was refused: {reply}")
                    return

    async def all_of_them() -> None:
        for index, token in enumerate(tokens):
            await submit(index, token)
        counts.on = False

    try:
        asyncio.run(all_of_them())
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def main(argv: list[str]) -> int:
    """Count ``argv[1]`` (default 10) in-process turns, or with ``--submissions`` a gateway's
    submissions, on the server at ``argv[0]``."""
    submissions = "--submissions" in argv
    argv = [a for a in argv if a != "--submissions"]
    if not argv or not argv[0].startswith("postgres"):
        print(
            "usage: python -m bench.round_trips POSTGRES_URL [TURNS] [--submissions]",
            file=sys.stderr,
        )
        return 2
    count = int(argv[1]) if len(argv) > 1 else 10
    counts = _Counts()
    _instrument(counts)
    env = BenchEnv.start(postgres=argv[0])
    try:
        (_submissions if submissions else _turns)(env, counts, count)
    finally:
        env.stop()
    trips = sum(n for what, n in counts.seen.items() if not what.startswith("prepared"))
    trips += counts.seen["prepared: SHOULD"]  # its PREPARE went alone, before the run
    if submissions:
        print(f"{count} first-turn submissions; per submission:")
    else:
        print(f"{count} turns of {turns.MODEL_STEPS} model steps; per turn:")
    for what, n in sorted(counts.seen.items()):
        print(f"  {what:<22} {n / count:6.1f}")
    print(f"  {'round trips':<22} {trips / count:6.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
